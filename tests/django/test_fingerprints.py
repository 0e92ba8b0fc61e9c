"""A submission's fingerprint (``guards/submissions.request_fingerprint``) is injective: two
submissions that differ in anything the view reads (method, path, query, each field's list of
values, uploaded files, a body and its type) never share one, and the same submission always
gets the same. A collision would swallow the second submission as a duplicate and show it the
first one's response."""

from __future__ import annotations

from urllib.parse import urlencode

from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import RequestFactory
from hypothesis import example, given, settings
from hypothesis import strategies as st

from django_redis_lock.guards.submissions import request_fingerprint

FORM = "application/x-www-form-urlencoded"

# Characters a form field carries through urlencoding, chosen for what an encoding could
# confuse: separators (of fields, values, lengths, JSON), escapes, a NUL, and characters of
# two to four bytes.
TEXT = 'ab0:=&;,|"\\[]{} %\x00\né€😀'
# Multipart's field and file names go into a header unescaped (Django's test client): keep to
# characters it carries, with the separators an encoding might have confused.
HEADER_TEXT = "ab:=&;,_- 0|."
METHODS = ("POST", "PUT", "PATCH")
PATHS = ("/order/", "/order/1/", "/pay/")
QUERIES = ("", "a=1", "a=1&a=2", "a=1%262")
BODY_TYPES = ("application/json", "text/plain", "application/xml")


class Reader:
    """Reads a submission off bytes that Hypothesis draws, each byte one choice (0 once they
    run out). One draw per submission instead of dozens: 10,000 pairs take seconds, not a
    minute, and Hypothesis shrinks bytes towards the first choices and the shortest texts."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def pick(self, choices):
        byte = self.data[self.at] if self.at < len(self.data) else 0
        self.at += 1
        return choices[byte % len(choices)]

    def count(self, least: int, most: int) -> int:
        return self.pick(range(least, most + 1))

    def text(self, alphabet: str = TEXT) -> str:
        return "".join(self.pick(alphabet) for _ in range(self.count(0, 4)))

    def fields(self, alphabet: str = TEXT):
        return [
            (self.text(alphabet), [self.text() for _ in range(self.count(1, 3))])
            for _ in range(self.count(0, 3))
        ]


def submission(data: bytes):
    """(method, path, query, what is submitted) read off ``data``: a form urlencoded, a form
    with files (multipart), or a body of some content type."""
    read = Reader(data)
    method, path, query = read.pick(METHODS), read.pick(PATHS), read.pick(QUERIES)
    kind = read.pick(("form", "files", "body"))
    if kind == "form":
        return method, path, query, ("form", read.fields())
    if kind == "files":
        uploads = [
            (read.text(HEADER_TEXT),
             [(read.text(HEADER_TEXT), read.text().encode()) for _ in range(read.count(1, 2))])
            for _ in range(read.count(0, 2))
        ]  # fmt: skip
        return method, path, query, ("files", _multipart_safe(read.fields(HEADER_TEXT)), uploads)
    body = bytes(read.pick(range(256)) for _ in range(read.count(0, 12)))
    return method, path, query, ("body", read.pick(BODY_TYPES), body)


def _multipart_safe(pairs):
    return [(name.replace('"', "").replace("\r", "").replace("\n", "") or "f", values)
            for name, values in pairs]  # fmt: skip


def regrouped(submission, cuts):
    """``submission``'s form fields with its names and values cut into other fields: the
    sequence of strings an encoding without counts would feed, grouped otherwise."""
    method, path, query, (kind, *rest) = submission
    if kind != "form":
        return submission
    tokens = [token for name, values in rest[0] for token in (name, *values)]
    groups, start = [], 0
    for cut in sorted(set(cuts)):
        if cut - start >= 2 and len(tokens) - cut >= 2:
            groups.append(tokens[start:cut])
            start = cut
    groups.append(tokens[start:])
    new_fields = [(group[0], group[1:]) for group in groups if len(group) >= 2]
    return method, path, query, ("form", new_fields)


def request(submission):
    """A Django request of ``submission``, as the browser or API client would send it."""
    method, path, query, (kind, *rest) = submission
    url = f"{path}?{query}" if query else path
    factory = RequestFactory()
    if kind == "form":
        pairs = [(name, value) for name, values in rest[0] for value in values]
        return factory.generic(method, url, urlencode(pairs), content_type=FORM)
    if kind == "files":
        data = {}
        for name, values in rest[0]:
            data.setdefault(name, []).extend(values)
        for name, files in rest[1]:
            data.setdefault(name or "upload", []).extend(
                SimpleUploadedFile(f"f{filename}", content) for filename, content in files
            )
        post = factory.post(url, data)  # multipart
        post.method = method
        return post
    content_type, body = rest
    return factory.generic(method, url, body, content_type=content_type)


def what_the_view_reads(request):
    """Everything of a submission that a view can read: what must tell two apart."""
    parts = [request.method, request.path, request.META.get("QUERY_STRING", "")]
    content_type = request.META.get("CONTENT_TYPE", "")
    # Django parses a form into request.POST for a POST only: another method's is its body.
    if request.method == "POST" and content_type.startswith(("multipart/form-data", FORM)):
        files = sorted(
            (name, [(upload.name, upload.read()) for upload in uploads])
            for name, uploads in request.FILES.lists()
        )
        return (*parts, "form", sorted(request.POST.lists()), files)
    return (*parts, content_type, request.body)


@settings(max_examples=10_000, deadline=None, derandomize=True)
@given(
    st.binary(max_size=64),
    st.one_of(st.binary(max_size=64), st.lists(st.integers(0, 12), max_size=4)),
)
@example(  # the defect: tag=news&tag=weekly&tag=sports was tag=news&weekly=sports
    ("POST", "/order/", "", ("form", [("tag", ["news", "weekly", "sports"])])),
    ("POST", "/order/", "", ("form", [("tag", ["news"]), ("weekly", ["sports"])])),
)
@example(  # empty values, and a value that looks like another field
    ("POST", "/order/", "", ("form", [("a", ["", ""])])),
    ("POST", "/order/", "", ("form", [("a", [""]), ("", [""])])),
)
def test_two_submissions_share_a_fingerprint_only_when_they_are_the_same(first, other):
    first = submission(first) if isinstance(first, bytes) else first
    # The other one: drawn on its own, or the first one's names and values regrouped.
    if isinstance(other, bytes):
        second = submission(other)
    else:
        second = other if isinstance(other, tuple) else regrouped(first, other)
    one, two = request(first), request(second)
    fingerprints = request_fingerprint(one), request_fingerprint(two)
    # Read after fingerprinting, as the view does: the fingerprint leaves the files readable.
    same = what_the_view_reads(one) == what_the_view_reads(two)
    assert (fingerprints[0] == fingerprints[1]) == same, (first, second)
    # The same submission sent again always gets the same fingerprint.
    assert request_fingerprint(request(first)) == fingerprints[0]


def test_a_form_is_the_same_submission_urlencoded_or_multipart():
    urlencoded = RequestFactory().post("/order/", urlencode({"item": "book"}), content_type=FORM)
    multipart = RequestFactory().post("/order/", {"item": "book"})
    assert request_fingerprint(urlencoded) == request_fingerprint(multipart)


def test_the_csrf_token_is_not_part_of_the_submission():
    def form(token):
        return RequestFactory().post("/order/", {"item": "book", "csrfmiddlewaretoken": token})

    assert request_fingerprint(form("a" * 64)) == request_fingerprint(form("b" * 64))


def test_the_same_body_of_another_type_is_another_submission():
    def body(content_type):
        return RequestFactory().generic("POST", "/order/", b"{}", content_type=content_type)

    assert request_fingerprint(body("application/json")) != request_fingerprint(body("text/plain"))
