"""Where a model's weights come from: the resolver over local roots, the local and cluster caches, and S3."""
