from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from rest_framework.routers import SimpleRouter

from django_redis_lock.metrics.views import metrics

from . import drf_views, toolbar_views, views

router = SimpleRouter()
router.register("api/orders", drf_views.OrderViewSet, basename="orders")

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics),
    path("toolbar/locks/", toolbar_views.locks),
    path("toolbar/async-locks/", toolbar_views.async_locks),
    path("order/", views.order),
    path("order-by-user/", views.order_by_user),
    path("checkout/form/", views.checkout_form),
    path("checkout/", views.checkout),
    path("checkout/done/", views.checkout_done),
    path("payment/", views.payment),
    path("async-order-by-user/", views.async_order_by_user),
    path("fixed-lease/", views.fixed_lease),
    path("patient/", views.patient),
    path("report/", views.report),
    path("anonymous-payment/", views.anonymous_payment),
    path("session-payment/", views.session_payment),
    path("stream/", views.stream),
    path("upload/", views.upload),
    path("failing/", views.failing),
    path("async-order/", views.async_order),
    path("decorated/", views.DecoratedView.as_view()),
    path("mixin/", views.MixinView.as_view()),
    path("async-mixin/", views.AsyncMixinView.as_view()),
    path("api/order/", drf_views.api_order),
    path("api/order-view/", drf_views.OrderAPIView.as_view()),
    path("api/patient/", drf_views.PatientAPIView.as_view()),
    path("api/session-order/", drf_views.SessionOrderAPIView.as_view()),
    *router.urls,
]
if "debug_toolbar" in settings.INSTALLED_APPS:  # (not in tests/settings_celery_only.py)
    # Always, not debug_toolbar_urls(): that gives none unless DEBUG.
    urlpatterns.append(path("__debug__/", include("debug_toolbar.urls")))
