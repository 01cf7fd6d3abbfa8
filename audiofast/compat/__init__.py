"""Other projects' APIs on audiofast's engines, so their users change one import line."""
