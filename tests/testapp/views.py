"""Views guarded by @prevent_double_submit, instrumented for the tests."""

import secrets
import threading
from collections import Counter

from asgiref.sync import sync_to_async
from django.http import HttpResponse, HttpResponseRedirect, JsonResponse, StreamingHttpResponse
from django.middleware.csrf import get_token
from django.utils.decorators import method_decorator
from django.utils.html import format_html
from django.views import View
from django.views.decorators.csrf import csrf_exempt

from django_redis_lock import PersonalIdentity, prevent_double_submit
from django_redis_lock.mixins import PreventDoubleSubmitMixin

runs: Counter = Counter()
runs_lock = threading.Lock()
# Set by a test to keep the first request running until the duplicates have been answered.
gate = threading.Event()
gate.set()
async_gate: dict = {}


def ran(name):
    with runs_lock:
        runs[name] += 1


# A shared identity: anyone may send any X-Client header (duplicates get 409, never a replay).
BY_HEADER = "header:X-Client"


def client(request):
    """The tests' stand-in for an authenticated API client: one person per ``X-Client``
    value, so duplicates are shown the first response (a personal identity)."""
    value = request.headers.get("X-Client")
    return PersonalIdentity(f"client:{value}") if value else None


BY_CLIENT = "tests.testapp.views.client"


@csrf_exempt  # the live-server test posts without a form
@prevent_double_submit(BY_CLIENT, wait=0)  # a duplicate while it runs: 409 at once
def order(request):
    ran("order")
    gate.wait(30)
    response = HttpResponseRedirect(f"/done/?item={request.POST.get('item', '')}")
    response.set_cookie("secret", "first-request-only")
    return response


@prevent_double_submit()  # the default key: the user, else the IP
def order_by_user(request):
    ran(f"order_by_user:{request.user.pk}")
    gate.wait(30)
    return HttpResponse("ordered")


def checkout_form(request):
    """A logged-in user's checkout page: one button, which the browser test double-clicks."""
    return HttpResponse(
        format_html(
            '<form method="post" action="/checkout/"><input type="hidden" '
            'name="csrfmiddlewaretoken" value="{}"><button>Place order</button></form>',
            get_token(request),
        )
    )


@prevent_double_submit()  # the defaults, as a Django project writes it: the user, else the IP
def checkout(request):
    ran("checkout")
    gate.wait(30)
    return HttpResponseRedirect(f"/checkout/done/?order={sum(runs.values())}")


def checkout_done(request):
    return HttpResponse(format_html("<h1>Order {} placed</h1>", request.GET["order"]))


@prevent_double_submit(BY_CLIENT, idempotency_header="Idempotency-Key")
def payment(request):
    ran("payment")
    gate.wait(30)
    return JsonResponse({"paid": request.POST.get("amount")}, status=201)


@csrf_exempt
@prevent_double_submit(BY_CLIENT, idempotency_header="Idempotency-Key")
def report(request):
    """A large response (``size`` bytes of it), replayable to an Idempotency-Key's retries."""
    ran("report")
    return HttpResponse(b"r" * int(request.POST.get("size", "60000")))


@csrf_exempt
@prevent_double_submit(idempotency_header="Idempotency-Key")  # the user, else the IP
def anonymous_payment(request):
    ran("anonymous_payment")
    return HttpResponse(f"receipt for {request.POST.get('payer')}: {secrets.token_hex(8)}")


@csrf_exempt
@prevent_double_submit("session", idempotency_header="Idempotency-Key")
def session_payment(request):
    ran("session_payment")
    return HttpResponse(f"receipt for {request.POST.get('payer')}: {secrets.token_hex(8)}")


@prevent_double_submit()  # the default key, on an async view: the user, found in a thread
async def async_order_by_user(request):
    ran(f"async_order_by_user:{await sync_to_async(lambda: request.user.pk)()}")
    return HttpResponse(f"ordered {secrets.token_hex(8)}")


# A lease that is not renewed may end while the view runs: its duplicates must not wait.
@prevent_double_submit(BY_CLIENT, timeout=30)
def fixed_lease(request):
    ran("fixed_lease")
    gate.wait(30)
    return HttpResponse("done")


@prevent_double_submit(BY_CLIENT)  # a person's duplicate waits for the first (10 s at most)
def patient(request):
    ran("patient")
    gate.wait(30)
    return HttpResponse("done")


@prevent_double_submit(BY_HEADER)
def stream(request):
    ran("stream")
    return StreamingHttpResponse(iter([b"a", b"b"]))


@prevent_double_submit(BY_CLIENT)
def upload(request):
    ran("upload")
    return HttpResponse(request.FILES["document"].read())


@prevent_double_submit(BY_HEADER)
def failing(request):
    ran("failing")
    raise RuntimeError("boom")


@prevent_double_submit(BY_CLIENT, wait=0)
async def async_order(request):
    ran("async_order")
    event = async_gate.get("event")
    if event is not None:
        await event.wait()
    return HttpResponse("async ordered")


@method_decorator(prevent_double_submit(BY_HEADER), name="post")
class DecoratedView(View):
    def post(self, request):
        ran("decorated_view")
        gate.wait(30)
        return HttpResponse("cbv")


class MixinView(PreventDoubleSubmitMixin, View):
    double_submit = {"key": BY_HEADER}

    def post(self, request):
        ran("mixin_view")
        gate.wait(30)
        return HttpResponse("mixin")

    def get(self, request):
        ran("mixin_view_get")
        return HttpResponse("read")


class AsyncMixinView(PreventDoubleSubmitMixin, View):
    double_submit = {"key": BY_CLIENT, "wait": 0}

    async def post(self, request):
        ran("async_mixin_view")
        event = async_gate.get("event")
        if event is not None:
            await event.wait()
        return HttpResponse("async mixin")


def duplicate(request, exception):
    return HttpResponse(f"custom {exception.status}", status=exception.status)
