"""Test and demo helpers: fault injection and a fake OpenAI-compatible VLM server."""
