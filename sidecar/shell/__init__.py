"""The imperative shell: settings, logging, the event loop, the scheduler and signals. Builds the graph."""
