"""The benchmark: the order saga against bare and durable Celery chains, one layout."""
