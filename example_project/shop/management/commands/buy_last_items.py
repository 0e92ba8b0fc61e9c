"""Several processes buy the last items of one product at once: nothing is oversold."""

import multiprocessing
import os

from django.core.management.base import BaseCommand

STOCK = 20


def buyer(product_id, ready):
    """Buy one item at a time until sold out; returns (bought, how many purchases waited)."""
    import django

    django.setup()
    from django_redis_lock import lock_contended
    from shop.models import Product, SoldOut

    waited = []
    lock_contended.connect(lambda **signal: waited.append(1), weak=False)
    product = Product.objects.get(pk=product_id)
    ready.wait()  # every process set up (spawned processes start one by one): all buy at once
    bought = 0
    while True:
        try:
            product.buy(1)
        except SoldOut:
            return bought, len(waited)
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
            ready = manager.Barrier(processes)
            with spawn.Pool(processes) as pool:
                results = [pool.apply_async(buyer, (product.pk, ready)) for _ in range(processes)]
                outcomes = [result.get(timeout=300) for result in results]
        bought = [count for count, _ in outcomes]
        waited = sum(waits for _, waits in outcomes)
        product.refresh_from_db()
        orders = Order.objects.filter(product=product).count()
        self.stdout.write(f"{processes} processes bought {bought} = {sum(bought)} items")
        self.stdout.write(
            f"{waited} of the {sum(bought) + processes} purchase attempts waited for another "
            "process to release the product's lock (the lock_contended signal)"
        )
        self.stdout.write(f"stock at start: {stock}, left: {product.stock}, orders: {orders}")
        oversold = sum(bought) - stock
        self.stdout.write(
            f"oversold: {oversold}" + (" — nothing was oversold" if oversold == 0 else "")
        )
