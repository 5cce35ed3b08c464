"""Where events live: the tables, their migrations, and connections to the database."""
