"""Kafka transactions, the coordinator's side: the state machine, its durable log and the coordinator.

``metadata.py`` (states and transitions), ``store.py`` (the transaction state log), ``coordinator.py`` (the API
surface and the marker seam, :class:`~tabletopic.transactions.coordinator.MarkerWriter`), ``markers.py`` (the markers
into the broker's partition logs). The request handlers are ``tabletopic/server/handlers/transactions.py``.
"""
