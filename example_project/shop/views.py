import time

from django.http import JsonResponse
from django.shortcuts import redirect, render

from django_redis_lock import prevent_double_submit

from .models import Order, Product, SoldOut


def shop(request):
    if not request.session.session_key:
        # A session tells this browser apart from others behind the same IP address, so
        # that @prevent_double_submit may replay its first response to its duplicates.
        request.session.save()
    product = Product.objects.first() or Product.objects.create(name="Django mug", stock=100)
    context = {
        "product": product,
        "orders": Order.objects.order_by("-id")[:10],
        "order_count": Order.objects.count(),
        "ordered": request.GET.get("ordered"),
    }
    return render(request, "shop/shop.html", context)


@prevent_double_submit("session")  # duplicates get 409, or the first response replayed
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
