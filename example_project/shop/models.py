from django.db import models

from django_redis_lock import LockableModelMixin, locked_method


class SoldOut(Exception):
    pass


class Product(LockableModelMixin, models.Model):
    name = models.CharField(max_length=100)
    stock = models.PositiveIntegerField(default=0)

    def __str__(self):
        return self.name

    @locked_method()
    def buy(self, quantity=1):
        """A plain read-modify-write of the stock: safe only because the row's lock is held
        (and the row reloaded once it is) across every process and host."""
        if self.stock < quantity:
            raise SoldOut(f"{self.name}: only {self.stock} left")
        self.stock -= quantity
        self.save(update_fields=["stock"])
        return Order.objects.create(product=self, quantity=quantity)


class Order(models.Model):
    product = models.ForeignKey(Product, on_delete=models.CASCADE)
    quantity = models.PositiveIntegerField()
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"order #{self.pk}: {self.quantity} x {self.product}"
