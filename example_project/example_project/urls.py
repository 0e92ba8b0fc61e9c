from django.conf import settings
from django.contrib import admin
from django.urls import path

from shop import views as shop

from . import views

urlpatterns = [
    path("", views.home, name="home"),
    path("shop/", shop.shop, name="shop"),
    path("shop/checkout/", shop.checkout, name="checkout"),
    path("shop/restock/", shop.restock, name="restock"),
    path("contention/", shop.make_contention, name="contention"),
    path("report/", shop.nightly_report, name="report"),
    path("admin/", admin.site.urls),
]

# The Debug Toolbar, with its Locks panel, when settings.py turned it on.
if "debug_toolbar" in settings.INSTALLED_APPS:
    from debug_toolbar.toolbar import debug_toolbar_urls

    urlpatterns += debug_toolbar_urls()
