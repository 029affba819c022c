"""What the emulator, the gateway and the load generator share about the OpenAI HTTP API."""
