"""A slow job that must never run twice at once: try it in two terminals."""

import os
import sys
import time

from django_redis_lock import SingleInstanceCommand


class Command(SingleInstanceCommand):
    help = "Send the invoices (slow on purpose). Run it again in another terminal meanwhile."

    def add_arguments(self, parser):
        parser.add_argument("--seconds", type=float, default=15)

    def handle(self, *args, seconds, **options):
        # The command as it was run (its Redis, this Python, this manage.py): it works again
        # verbatim in another terminal.
        redis = " ".join(
            f"{name}={os.environ[name]}" for name in ("REDIS_URL", "DEMO_REDIS_DIR")
            if os.environ.get(name)
        )  # fmt: skip
        python, manage = os.path.relpath(sys.executable), os.path.relpath(sys.argv[0])
        again = f"{redis} {python} {manage} send_invoices".lstrip()
        self.stdout.write(
            f"Sending invoices… run `{again}` in another terminal now: it will say this one "
            "holds the lock and exit."
        )
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(min(1, max(0, deadline - time.monotonic())))
            self.stdout.write(".", ending="")
            self.stdout.flush()
        self.stdout.write("\ndone.")
