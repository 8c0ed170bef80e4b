"""Model inputs: where a recipe's checkpoint comes from, and its validation before conversion."""
