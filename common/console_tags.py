"""``{% load console %}`` (registered in settings.TEMPLATES): the operations console's
template filters that every app's admin templates use.

``{{ original.pk|plain_id }}`` puts an id in a URL as the API shows it (``pay_01...``, not
Django's ``pay_5F01...``), as ``common.admin_tools.id_in_url`` does."""

from django import template

register = template.Library()


@register.filter(name="plain_id")
def plain_id(pk) -> str:
    from common.admin_tools import id_in_url  # on use: loading a template library must not load the admin

    return id_in_url(pk)
