import time

from django.http import JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from django_redis_lock import Lock, LockNotAcquired, prevent_double_submit

from . import contention
from .models import Order, Product, SoldOut

MUG, STOCK = "Django mug", 100


def _mug() -> Product:
    # By name: buy_last_items sells a product of its own, which must not become the shop's.
    return Product.objects.get_or_create(name=MUG, defaults={"stock": STOCK})[0]


def shop(request):
    if not request.session.session_key:
        # A session tells this browser apart from others behind the same IP address, so
        # that @prevent_double_submit may replay its first response to its duplicates.
        request.session.save()
    product = _mug()
    context = {
        "product": product,
        "orders": Order.objects.order_by("-id")[:10],
        "order_count": Order.objects.count(),
        "ordered": request.GET.get("ordered"),
        "restocked": request.GET.get("restocked"),
    }
    return render(request, "shop/shop.html", context)


# A session is one person: a duplicate waits for the first request and is shown its response.
@prevent_double_submit("session")
def checkout(request):
    time.sleep(0.5)  # a slow payment provider: plenty of time for a double click
    product = Product.objects.get(pk=request.POST["product"])
    try:
        order = product.buy(int(request.POST.get("quantity", 1)))
    except SoldOut as exc:
        if "json" in request.headers.get("Accept", ""):
            return JsonResponse({"error": str(exc)}, status=409)
        return redirect("shop")
    if "json" in request.headers.get("Accept", ""):
        return JsonResponse({"order": order.pk, "stock_left": product.stock}, status=201)
    return redirect(f"/shop/?ordered={order.pk}")


@require_POST
def restock(request):
    """Back to 100 in stock, under the row's lock like every purchase."""
    with _mug().lock():
        Product.objects.filter(name=MUG).update(stock=STOCK)
    return redirect("/shop/?restocked=1")


@require_POST
def make_contention(request):
    """Start a minute of contention (``contention.py``) and say where to watch it."""
    started = contention.start()
    return redirect(f"/?contention={'started' if started else 'running'}")


def nightly_report(request):
    """A request that takes the nightly report's lock: during the contention it waits its
    turn behind the workers (the Debug Toolbar's Locks panel shows for how long, and for
    whom); it gives up after 10 s."""
    try:
        with Lock(contention.REPORT, wait=10, label="nightly report (a request)"):
            time.sleep(0.2)  # building it
            outcome = "built"
    except LockNotAcquired as exc:
        outcome = f"not built: {exc}"
    return render(request, "shop/report.html", {"outcome": outcome})
