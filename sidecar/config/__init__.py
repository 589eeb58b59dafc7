"""The settings machinery every command shares: config files, flags, the environment, and where each value came
from. Below the shell and the tools, above the adapters and the core; it knows no command's settings."""
