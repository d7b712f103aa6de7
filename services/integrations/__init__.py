"""Framework adapters over ``EngramClient``: LangGraph, OpenAI Agents SDK, AutoGen."""
