"""A recipe's models made ready for its engine: resolved (repo, path, package or generated), re-fitted
(edgekit.align) when the recipe asks, then converted (edgekit.convert). Above both, so neither imports the other
back."""
