"""Create the configured PostgreSQL database if it does not exist yet (for `make run`)."""

import psycopg
from django.core.management.base import BaseCommand
from django.db import connection
from psycopg import sql


class Command(BaseCommand):
    help = "Create the database named by DATABASE_URL when it is missing."

    def handle(self, *args, **options):
        params = connection.get_connection_params()
        name = connection.settings_dict["NAME"]
        params["dbname"] = "postgres"
        with psycopg.connect(**params, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            if exists:
                self.stdout.write(f"database {name} exists")
                return
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            self.stdout.write(self.style.SUCCESS(f"created database {name}"))
