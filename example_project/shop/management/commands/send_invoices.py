"""A slow job that must never run twice at once: try it in two terminals."""

import time

from django_redis_lock import SingleInstanceCommand


class Command(SingleInstanceCommand):
    help = "Send the invoices (slow on purpose). Run it again in another terminal meanwhile."

    def add_arguments(self, parser):
        parser.add_argument("--seconds", type=float, default=15)

    def handle(self, *args, seconds, **options):
        self.stdout.write(
            "Sending invoices… run `python example_project/manage.py send_invoices` in another "
            "terminal now: it will say this one holds the lock and exit."
        )
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(min(1, max(0, deadline - time.monotonic())))
            self.stdout.write(".", ending="")
            self.stdout.flush()
        self.stdout.write("\ndone.")
