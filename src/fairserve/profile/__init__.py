"""`fairserve profile`: measure an engine's step times and write a profile file (`sim/engine_profile.py`) that
`--profile PATH` reads wherever a latency preset is taken (simulate, sweep, reproduce, emulate).

- `grid.py`: the rows measured (prompt length × batch size, decoded a fixed number of steps) and their medians;
- `vllm.py`: vLLM in-process (`--engine vllm --model PATH`), each step timed around `LLMEngine.step()`;
- `http.py`: any OpenAI-compatible server through HTTP (`--engine http --url URL`), from streamed tokens;
- `cli.py`: the command.
"""
