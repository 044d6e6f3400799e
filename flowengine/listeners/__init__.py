"""flowengine package."""
