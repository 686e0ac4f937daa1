"""One construct per concern; stacks in `infra.stacks` compose them and wire grants."""
