"""JSON documents for people and scripts (`once --json`, `/status`). Pure: values in, plain dicts out."""
