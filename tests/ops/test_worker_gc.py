"""Worker processes freeze the objects they start with (delaypay/celery.py): the cyclic
collector's full collections then walk only what the batches allocate."""

import gc

from celery.signals import worker_process_init, worker_ready

from delaypay.celery import _freeze_startup_objects


def test_each_worker_process_freezes_what_it_started_with():
    for signal in (worker_process_init, worker_ready):
        assert _freeze_startup_objects in signal._live_receivers(None), signal.name
    before = gc.get_freeze_count()
    try:
        _freeze_startup_objects()
        # Django, Celery and the app: tens of thousands of objects, none of them walked
        # by a collection from now on.
        assert gc.get_freeze_count() - before > 10_000
    finally:
        gc.unfreeze()
