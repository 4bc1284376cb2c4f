"""Turns: chains of model steps, the step runtime and its watch, the tool registry and
the tool calls a turn makes, and the sweeper that ends lost turns."""
