"""The LVLM backend: Qwen2.5-VL behind vLLM's OpenAI-compatible server (paper-faithful and hybrid)."""
