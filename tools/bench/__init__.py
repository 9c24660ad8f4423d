"""The benchmark: the order saga against bare and durable Celery chains, one layout.

``cli`` (the command: options, its own vhost and database, the configurations in turn),
``runner`` (one configuration measured), ``workloads`` (chains and sagas started and
timed), ``baseline`` (the chains' Celery app), ``sweep`` (the sweeper on a large table),
``web`` (the dashboard and API timed), ``report`` (results built and printed).
"""
