"""Keys by API: keys made, listed and revoked through `/admin/keys`, kept hashed beside the config file's keys (the
book and what a request reads of it, the stores, the part that syncs them, the admin routes)."""
