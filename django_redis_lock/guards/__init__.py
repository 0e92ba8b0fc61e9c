"""Guards built on the primitives, for views, model rows, jobs and caches: decorators, double
submit (and its replays), ``run_once``, ``single_instance``, ``get_or_set_locked``, fenced
writes."""
