"""The HTTP edge: the app's routes (OpenAI-compatible, admin, health, metrics), the OpenAPI document, request bodies and
/tokenize."""
