"""Private modules of the SQLAlchemy backend: tables, migrations, engine set-up, queries."""
