"""``{% load console_access %}``: ``{% staff_group_offers as offers %}`` gives the front page of
a staff user in no group the groups to ask for and what each lets its members do
(console/refusal.py)."""

from django import template

from console.refusal import staff_group_offers as offers

register = template.Library()


@register.simple_tag
def staff_group_offers():
    return offers()
