"""``manage.py openapi_reference [--check]``: write the served OpenAPI schema to
docs/reference/openapi.yaml and its Markdown rendering to docs/reference/endpoints.md
(devtools/openapi_reference.py); with --check, write nothing and exit 1 if either is stale."""

from django.core.management.base import BaseCommand, CommandError

from devtools import openapi_reference


class Command(BaseCommand):
    help = "Write docs/reference/openapi.yaml and docs/reference/endpoints.md from the served schema."

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="compare only; exit 1 if a file is stale")

    def handle(self, *args, check: bool = False, **options):
        if check:
            stale = openapi_reference.stale()
            if stale:
                names = ", ".join(str(p.relative_to(p.parents[2])) for p in stale)
                raise CommandError(f"stale: {names}; regenerate with {openapi_reference.REGENERATE}")
            self.stdout.write("docs/reference/openapi.yaml and endpoints.md are up to date")
            return
        for path, content in openapi_reference.generated().items():
            path.write_bytes(content)
            self.stdout.write(f"wrote {path.relative_to(path.parents[2])} ({len(content)} bytes)")
