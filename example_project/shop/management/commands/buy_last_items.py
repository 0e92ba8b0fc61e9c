"""Several processes buy the last items of one product at once: nothing is oversold."""

import multiprocessing
import os

from django.core.management.base import BaseCommand

STOCK = 20


def buyer(product_id, start):
    import django

    django.setup()
    from shop.models import Product, SoldOut

    product = Product.objects.get(pk=product_id)
    start.wait()
    bought = 0
    while True:
        try:
            product.buy(1)
        except SoldOut:
            return bought
        bought += 1


class Command(BaseCommand):
    help = "Start several processes that buy the last items of a product at the same time."

    def add_arguments(self, parser):
        parser.add_argument("--processes", type=int, default=6)
        parser.add_argument("--stock", type=int, default=STOCK)

    def handle(self, *args, processes, stock, **options):
        from shop.models import Order, Product

        product, _ = Product.objects.get_or_create(name="Last-items sale")
        product.stock = stock
        product.save()
        Order.objects.filter(product=product).delete()
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
        spawn = multiprocessing.get_context("spawn")
        with spawn.Manager() as manager:
            start = manager.Event()
            with spawn.Pool(processes) as pool:
                results = [pool.apply_async(buyer, (product.pk, start)) for _ in range(processes)]
                start.set()
                bought = [result.get(timeout=300) for result in results]
        product.refresh_from_db()
        orders = Order.objects.filter(product=product).count()
        self.stdout.write(f"{processes} processes bought {bought} = {sum(bought)} items")
        self.stdout.write(f"stock at start: {stock}, left: {product.stock}, orders: {orders}")
        oversold = sum(bought) - stock
        self.stdout.write(
            f"oversold: {oversold}" + (" — nothing was oversold" if oversold == 0 else "")
        )
