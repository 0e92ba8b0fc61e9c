from django.db import models

from django_redis_lock import LockableModelMixin, locked_method


class Account(LockableModelMixin, models.Model):
    balance = models.IntegerField(default=0)
    fencing_token = models.BigIntegerField(null=True, editable=False)

    def __str__(self):
        return f"account {self.pk}"

    @locked_method()
    def deposit(self, amount):
        # A plain read-modify-write, no F(): only the lock keeps it from losing updates.
        self.balance = self.balance + amount
        self.save(update_fields=["balance"])

    @locked_method()
    def deposit_twice(self, amount):
        self.deposit(amount)  # another locked method of the same row: re-entry, no deadlock
        self.deposit(amount)

    @locked_method(suffix="statement", wait=0)
    def make_statement(self):
        return self.lock("statement").locked()
