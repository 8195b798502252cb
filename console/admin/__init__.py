"""The payments operations console: the admin of the payments app's models, one module a
subject (display, filters, review, payments, recurring, audit).

Staff read everything; they change state only through the services the API uses:
"Cancel" (bulk action and the detail page's button) calls ``payment_cancel_by_staff``
(the cancel CAS and a staff action with the reason); the review queue's "Re-drive" and
"Resolve as failed" call ``payment_redrive`` / ``payment_resolve``; each of these goes
through a confirmation page that counts what will change and asks for a reason (common/
admin_tools.py, ConfirmedActAdminMixin). "Pause" and "Resume" on recurring payments call
``recurring_pause`` / ``recurring_resume``. No money field, status or time is editable,
nothing can be added or deleted, and the database triggers would refuse it anyway.
"""

from django.contrib import admin

admin.site.site_header = "delaypay operations"
admin.site.site_title = "delaypay operations"
admin.site.index_title = "Operations console"
admin.site.site_url = None  # no public site to link to
admin.site.enable_nav_sidebar = False  # the payment list is wide; give it the whole page

# Importing the modules registers their ModelAdmins (the admin's autodiscovery imports
# this package).
from . import audit, payments, recurring  # noqa: E402, F401
