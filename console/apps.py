from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The payments console: the admin of the payments app's models, its dashboard, limits
    and rails pages, and the demo command."""

    name = "console"

    def ready(self):
        # Every ModelAdmin, ours and other apps', answers 403 to an action the user may not
        # run (common/admin_tools.py); the admin's autodiscovery has run by now.
        from django.contrib import admin

        from common.admin_tools import (
            make_tokens_and_login_records_view_only,
            mend_axes_cleanup_action,
            name_login_records_in_plain_times,
            refuse_unpermitted_actions_everywhere,
        )

        mend_axes_cleanup_action(admin.site)
        name_login_records_in_plain_times()
        make_tokens_and_login_records_view_only(admin.site)
        refuse_unpermitted_actions_everywhere(admin.site)
