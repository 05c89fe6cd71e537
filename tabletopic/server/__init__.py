"""The asyncio network server and the request handlers."""
