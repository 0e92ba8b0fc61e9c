"""``manage.py run_locked [--lock-name NAME] [--lock-wait S] [--lock-timeout S] COMMAND [ARGS...]``

Runs any management command, such as ``clearsessions``, at most once at a time across every
host sharing the Redis, without changing its code. The lock is named ``run_locked:COMMAND``
unless ``--lock-name`` says otherwise.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management import call_command
from django.core.management.base import CommandParser

from django_redis_lock.management.base import SingleInstanceCommand


class Command(SingleInstanceCommand):
    help = "Run a management command while holding a lock, so it never runs twice at once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--lock-name", help="the lock's name (default: run_locked:COMMAND)")
        parser.add_argument("command_name", metavar="COMMAND", help="the command to run")
        parser.add_argument("command_args", nargs=argparse.REMAINDER, metavar="ARGS")

    def get_lock_name(self, *args: Any, **options: Any) -> str:
        return str(options.get("lock_name") or f"run_locked:{options['command_name']}")

    def handle(self, *args: Any, **options: Any) -> None:
        call_command(options["command_name"], *options["command_args"])
