"""What acts: command handling, query responders, the CLI, the client and the app's wiring."""
