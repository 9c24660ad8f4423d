"""The API's routes, one router per concern, included by ``saga_tasks.web.api.build`` in
the order their paths must be matched."""
