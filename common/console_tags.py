"""``{% load console %}`` (registered in settings.TEMPLATES): the operations console's
template filters that every app's admin templates use.

``{{ value|human }}`` shows a number, a time, a duration, a user or a reason as staff read it
(common/formats.py, the helper the admin displays call too): ``{{ amount|human }}`` is
1,000,000, ``{{ at|human }}`` 2026-12-05 01:02:03 UTC, ``{{ rule|human:"every" }}`` every 1 minute.

``{{ original.pk|plain_id }}`` puts an id in a URL as the API shows it (``pay_01...``, not
Django's ``pay_5F01...``), as ``common.admin_tools.id_in_url`` does."""

from django import template

from common.formats import human

register = template.Library()

register.filter("human", human)


@register.filter(name="plain_id")
def plain_id(pk) -> str:
    from common.admin_tools import id_in_url  # on use: loading a template library must not load the admin

    return id_in_url(pk)
