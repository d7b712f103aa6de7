"""The agent's surface: tool profiles and their dispatcher, the MCP server."""
