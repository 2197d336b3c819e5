"""The embedding API's routers: health, embed, search, items, classify, models."""
