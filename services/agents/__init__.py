"""The agent's surface: tool specs (specs.py), one module per profile (profiles/), the profiles'
registry and dispatcher (tools.py), the MCP server (mcp_server.py)."""
