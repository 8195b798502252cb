"""End to end in a real browser: headless Chromium (Debian's package) driven by Playwright
against the live server. .ci/run installs Chromium where it is missing."""

import os
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse
from playwright.sync_api import expect, sync_playwright

from ledger.models import Account, StaffAction, Transfer
from payments.models import PaymentStatus
from payments.services import payment_cancel
from tests.factories import PASSWORD, UserFactory, funded_account, future_payment

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]

# Every run writes the main pages as a staff member sees them at 1440x900 into
# var/screenshots/, or where DELAYPAY_SCREENSHOTS says: `make screenshots` points it at the
# docs (docs/reference/admin-console.md, "Screenshots"), so a test run leaves the
# checkout's tracked pictures alone.
_ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = _ROOT / os.environ.get("DELAYPAY_SCREENSHOTS", "var/screenshots")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK),
        reason=f"Chromium is not installed at {CHROMIUM} (apt-get install chromium; .ci/run does it)",
    ),
]


@pytest.fixture
def browser_settings(settings):
    """The live server speaks plain HTTP: cookies must not be Secure-only (DJANGO_SECURE_COOKIES
    off), and static files are served unhashed by the live server's static handler."""
    settings.SESSION_COOKIE_SECURE = False
    settings.CSRF_COOKIE_SECURE = False
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


def screenshot(page, name: str) -> None:
    """The visible part of the page (what is above the fold), as SCREENSHOTS/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / f"{name}.png")


@contextmanager
def chromium_page(base_url: str):
    """A page in headless Chromium. Playwright's sync API runs an event loop in this
    thread, where Django refuses database calls: set data up before, assert after."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1440, "height": 900}, base_url=base_url)
            context.set_default_timeout(15_000)
            yield context.new_page()
        finally:
            browser.close()


@pytest.mark.django_db(transaction=True)
def test_staff_cancels_a_scheduled_payment_from_the_changelist(live_server, browser_settings, tmp_path):
    staff = UserFactory(is_staff=True, is_superuser=True)
    source, target = funded_account(balance=100), funded_account()
    keep = future_payment(source=source, target=target, minutes=30)
    doomed = future_payment(source=source, target=target, minutes=40)
    already = future_payment(source=source, target=target, minutes=50)
    payment_cancel(payment_id=already.pk, actor=staff)

    with chromium_page(live_server.url) as page:
        page.goto("/admin/")
        page.fill("#id_username", staff.username)
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        expect(page.locator("#user-tools")).to_contain_text(staff.username)

        page.goto(reverse("admin:payments_scheduledpayment_changelist"))
        page.locator("#changelist-filter").get_by_role("link", name="Scheduled", exact=True).click()
        page.wait_for_url("**status__exact=SCHEDULED**")
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(2)
        expect(page.locator("#result_list")).not_to_contain_text(already.pk)
        screenshot(page, "changelist-scheduled")

        page.check(f'input[name="_selected_action"][value="{doomed.pk}"]')
        page.select_option('select[name="action"]', "cancel_selected")
        page.get_by_role("button", name="Go").click()

        # One click never cancels: a confirmation page counts the selection and asks why.
        expect(page.locator("#dp-act-count")).to_contain_text("1 of the 1 scheduled payment listed will change")
        page.fill("#id_reason", "customer asked")
        screenshot(page, "confirm-cancel")
        page.locator('input[name="_cancel"]').click()

        expect(page.locator(".messagelist .success")).to_have_text(f"Cancelled: {doomed.pk}.")
        expect(rows).to_have_count(1)  # still filtered to SCHEDULED: the cancelled one has left
        expect(page.locator("#result_list")).to_contain_text(keep.pk)

        page.goto(reverse("admin:payments_scheduledpayment_change", args=[quote(doomed.pk)]))
        expect(page.locator(".dp-badge")).to_have_text("CANCELLED")
        # The timeline's cancelled event names the staff member who cancelled it.
        expect(page.locator("#dp-timeline tr", has_text="cancelled")).to_contain_text(staff.username)
        screenshot(page, "payment-cancelled")

        page.goto(reverse("admin-dashboard"))
        expect(page.locator("#dp-counts")).to_contain_text("CANCELLED")
        screenshot(page, "dashboard")

    doomed.refresh_from_db()
    keep.refresh_from_db()
    assert (doomed.status, keep.status) == (PaymentStatus.CANCELLED, PaymentStatus.SCHEDULED)


@pytest.mark.django_db(transaction=True)
def test_back_and_submit_again_deposits_once(live_server, browser_settings, tmp_path):
    """The issue's reproduction (0 -> 2,500 -> 5,000) in a real browser: deposit, press
    Back to the form, submit again. The form's URL carries its one-time token, so Back
    returns to the same, consumed form: one deposit."""
    staff = UserFactory(is_staff=True, is_superuser=True)
    account = funded_account(balance=0)
    with chromium_page(live_server.url) as page:
        page.goto("/admin/")
        page.fill("#id_username", staff.username)
        page.fill("#id_password", PASSWORD)
        page.click("input[type=submit]")
        page.goto(reverse("admin:ledger_account_change", args=[quote(account.pk)]))
        page.click("#dp-deposit")
        page.wait_for_url("**/deposit/?form=adep_*")
        form_url = page.url
        page.fill("#id_amount", "2500")
        page.fill("#id_reason", "opening balance")
        page.get_by_role("button", name="Deposit").click()
        expect(page.locator(".messagelist .success")).to_contain_text("Deposited 2,500")

        page.go_back()  # the browser's Back: to the form's page
        assert page.url == form_url
        submit = page.get_by_role("button", name="Deposit")
        if submit.count():  # restored from the browser's cache with the amount still in it
            submit.click()
            expect(page.locator(".messagelist .warning")).to_contain_text("already submitted")
        else:  # fetched again: the page says what the form did
            expect(page.locator("#dp-deposit-submitted")).to_contain_text("2,500 was deposited")
        page.reload()
        expect(page.locator("#dp-deposit-submitted")).to_contain_text("already submitted")
        screenshot(page, "deposit-back")

    assert Account.objects.get(pk=account.pk).balance == 2500
    assert Transfer.objects.filter(credit_account_id=account.pk).count() == 1
    assert StaffAction.objects.get(account_id=account.pk).reason == "opening balance"


def log_in(page, user) -> None:
    page.goto("/admin/")
    page.fill("#id_username", user.username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    expect(page.locator("#user-tools")).to_contain_text(user.username)


@pytest.mark.django_db(transaction=True)
def test_staff_export_the_failed_list_as_csv(live_server, browser_settings, tmp_path):
    """The failed list, filtered in the browser, leaves as a CSV of exactly those rows,
    named after the filter."""
    from payments.promoter import claim_due
    from payments.worker import run_batch
    from tests.factories import due_payment

    staff = UserFactory(is_staff=True, is_superuser=True)
    poor, target = funded_account(balance=5), funded_account()
    failed = due_payment(source=poor, target=target, amount=50)
    future_payment(source=poor, target=target, minutes=30)  # scheduled: not in the export
    claim = claim_due(batch=10, lease_seconds=60)
    run_batch(claim.fresh, worker="test")

    with chromium_page(live_server.url) as page:
        log_in(page, staff)
        page.goto(reverse("admin:payments_scheduledpayment_changelist"))
        page.locator("#changelist-filter").get_by_role("link", name="Failed", exact=True).click()
        page.wait_for_url("**status__exact=FAILED**")
        expect(page.locator("#result_list tbody tr")).to_have_count(1)
        screenshot(page, "changelist-failed")
        with page.expect_download() as download:
            page.click("#dp-export")
        path = tmp_path / "export.csv"
        download.value.save_as(path)
        name = download.value.suggested_filename

    assert name.startswith("payments_") and "status-FAILED" in name and name.endswith(".csv"), name
    lines = path.read_text().splitlines()
    assert len(lines) == 2, lines  # the header and the failed payment
    assert failed.pk in lines[1] and "insufficient_funds" in lines[1]


@pytest.mark.django_db(transaction=True)
def test_staff_freeze_an_account_from_its_page_with_a_reason(live_server, browser_settings, tmp_path):
    staff = UserFactory(is_staff=True, is_superuser=True)
    account = funded_account(balance=10)
    with chromium_page(live_server.url) as page:
        log_in(page, staff)
        page.goto(reverse("admin:ledger_account_change", args=[quote(account.pk)]))
        page.click("#dp-freeze")
        # The confirmation page asks why; nothing changes before its submit.
        page.fill("#id_reason", "suspected account takeover")
        page.locator('input[name="_freeze"]').click()
        expect(page.locator(".messagelist .success")).to_contain_text("Frozen")
        expect(page.locator("#dp-unfreeze")).to_be_visible()
        screenshot(page, "account-frozen")

    account.refresh_from_db()
    assert account.status == Account.Status.FROZEN
    action = StaffAction.objects.get(account_id=account.pk)
    assert (action.action, action.reason, action.actor_id) == ("freeze", "suspected account takeover", staff.pk)


@pytest.mark.django_db(transaction=True)
def test_staff_investigate_a_failed_payment_from_the_dashboard(live_server, browser_settings, tmp_path):
    """Dashboard -> the last hour's failures by reason -> the failed event -> its payment,
    whose page says at the top what happened and who was involved."""
    from payments.promoter import claim_due
    from payments.worker import run_batch
    from tests.factories import due_payment

    staff = UserFactory(is_staff=True, is_superuser=True)
    poor, target = funded_account(balance=5), funded_account()
    failed = due_payment(source=poor, target=target, amount=50)
    claim = claim_due(batch=10, lease_seconds=60)
    run_batch(claim.fresh, worker="test")

    with chromium_page(live_server.url) as page:
        log_in(page, staff)
        page.goto(reverse("admin-dashboard"))
        page.click("#dp-failed-insufficient_funds")
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(1)
        rows.first.get_by_role("link", name=failed.pk).click()
        page.wait_for_url(f"**/{failed.pk}/change/**")
        expect(page.locator(".dp-badge").first).to_have_text("FAILED")
        expect(page.locator("#content")).to_contain_text("insufficient_funds")
        expect(page.locator("#content")).to_contain_text(poor.owner.username)
        # The timeline holds the attempt and the event that ended it.
        expect(page.locator("#dp-timeline tr", has_text="EXECUTING → FAILED")).to_be_visible()
        expect(page.locator("#dp-timeline tr", has_text="attempt 1: failed")).to_be_visible()
        screenshot(page, "payment-failed")


@pytest.mark.django_db(transaction=True)
def test_staff_end_a_recurring_series_from_its_page_with_a_reason(live_server, browser_settings):
    from datetime import timedelta

    from django.utils import timezone

    from payments.models import RecurringPayment, RecurringStatus, ScheduledPayment
    from recurring.services import recurring_create

    staff = UserFactory(is_staff=True, is_superuser=True)
    source, target = funded_account(balance=100), funded_account()
    rec = recurring_create(
        payer=source.owner, from_account_id=source.id, to_account_id=target.id, amount=7,
        start_at=timezone.now() + timedelta(hours=1), interval="P1D",
    )
    with chromium_page(live_server.url) as page:
        log_in(page, staff)
        page.goto(reverse("admin:payments_recurringpayment_change", args=[rec.pk]))
        screenshot(page, "recurring")
        page.click("#dp-end-series")
        expect(page.locator("#dp-act-count")).to_contain_text("1 of the 1 recurring payment listed will change")
        page.fill("#id_reason", "customer closed the subscription")
        page.locator('input[name="_end"]').click()
        expect(page.locator(".messagelist .success")).to_have_text(f"Ended: {rec.pk}.")
        expect(page.locator("#dp-end-series")).to_have_count(0)

    assert RecurringPayment.objects.get(pk=rec.pk).status == RecurringStatus.ENDED
    assert not ScheduledPayment.objects.filter(recurring_id=rec.pk, status="SCHEDULED").exists()


@pytest.mark.django_db(transaction=True)
def test_front_page_operations_links_wrap_at_most_to_two_lines(live_server, browser_settings):
    """At 1440x900 the Operations module's description column once squeezed the link column
    to a letter's width: each link wrapped one letter per line (issue 36, point 1)."""
    staff = UserFactory(is_staff=True, is_superuser=True)

    with chromium_page(live_server.url) as page:
        log_in(page, staff)
        links = page.locator(".app-operations th a")
        expect(links).to_have_count(4)
        for link in links.all():
            height = link.evaluate("a => a.getBoundingClientRect().height")
            line_height = link.evaluate(
                "a => { const s = getComputedStyle(a); return s.lineHeight === 'normal'"
                " ? 1.2 * parseFloat(s.fontSize) : parseFloat(s.lineHeight); }"
            )
            assert height <= 2 * line_height + 1, f"{link.inner_text()!r} is {height}px tall, line {line_height}px"


@pytest.mark.django_db(transaction=True)
def test_back_after_a_list_action_shows_the_confirmation_page_again_not_a_resubmission(live_server, browser_settings):
    """The selection's POST is answered with a redirect to the confirmation page (a GET) and
    its submit with a redirect to the list: Back returns to the page, saying nothing is left
    to change, where it once asked the browser to post the form again (issue 36, point 7)."""
    staff = UserFactory(is_staff=True, is_superuser=True)
    payment = future_payment(source=funded_account(balance=100), target=funded_account(), minutes=30)

    with chromium_page(live_server.url) as page:
        log_in(page, staff)
        page.goto(reverse("admin:payments_scheduledpayment_changelist") + "?status__exact=SCHEDULED")
        page.check(f'input[name="_selected_action"][value="{payment.pk}"]')
        page.select_option('select[name="action"]', "cancel_selected")
        page.get_by_role("button", name="Go").click()
        page.wait_for_url("**/selected/cancel/?selection=*")
        page.fill("#id_reason", "customer asked")
        page.get_by_role("button", name="Cancel 1 scheduled payment").click()
        expect(page.locator(".messagelist .success")).to_have_text(f"Cancelled: {payment.pk}.")

        page.go_back()
        expect(page.locator("#dp-act-count")).to_contain_text("0 of the 1 scheduled payment listed will change")
        expect(page.locator('input[name="_cancel"]')).to_be_disabled()
    payment.refresh_from_db()
    assert payment.status == PaymentStatus.CANCELLED


# --- issue 36, points 8 and 9: finding the customer, layout and formats -------------------------


def overflow(page) -> dict[str, int]:
    """How far the page, and the changelist's own scrolling box (Django's ``.results``,
    overflow-x: auto), are wider than what shows: more than 0 is a horizontal scroll bar."""
    return page.evaluate("""() => {
        const doc = document.documentElement, results = document.querySelector('.results');
        return {page: Math.max(doc.scrollWidth, document.body.scrollWidth) - window.innerWidth,
                results: results ? results.scrollWidth - results.clientWidth : 0,
                table: Math.round(document.querySelector('#result_list').getBoundingClientRect().right)};
    }""")


@pytest.mark.django_db(transaction=True)
def test_payments_list_fits_a_1440_pixel_window(live_server, browser_settings):
    """At 1440x900 the payments list once scrolled sideways: long names, two timestamps and
    a failure reason in a row. It must fit, filters included."""
    from payments.promoter import claim_due
    from payments.worker import run_batch
    from tests.factories import due_payment

    staff = UserFactory(is_staff=True, is_superuser=True, username="operations-lead-with-a-long-name")
    owner = UserFactory(username="customer-with-a-rather-long-username-2026")
    poor = funded_account(owner=owner, balance=5, name="Family holiday fund for the summer of 2026")
    target = funded_account(name="Landlord's rent account, flat 4B, Rue de la République")
    due_payment(source=poor, target=target, amount=1_234_567)
    run_batch(claim_due(batch=10, lease_seconds=60).fresh, worker="test")
    for minutes in (30, 40):
        future_payment(source=poor, target=target, minutes=minutes)

    with chromium_page(live_server.url) as page:
        log_in(page, staff)
        page.goto(reverse("admin:payments_scheduledpayment_changelist"))
        expect(page.locator("#result_list tbody tr")).to_have_count(3)
        expect(page.locator("#result_list")).to_contain_text("Insufficient funds")
        screenshot(page, "changelist")
        measured = overflow(page)
    assert measured["page"] <= 0 and measured["results"] <= 0 and measured["table"] <= 1440, measured


@pytest.mark.django_db(transaction=True)
def test_an_id_pasted_into_the_header_search_opens_its_page(live_server, browser_settings):
    """From any console page: paste an id into the header's search box, press Enter, land on
    its page; a garbage search says nothing matched, on a page (issue 36, point 8)."""
    staff = UserFactory(is_staff=True, is_superuser=True)
    source, target = funded_account(balance=100, name="Holiday fund"), funded_account()
    payment = future_payment(source=source, target=target, minutes=30)

    with chromium_page(live_server.url) as page:
        log_in(page, staff)
        page.goto(reverse("admin:ledger_transfer_changelist"))
        box = page.locator("#dp-global-search input[name=q]")
        box.fill(f" {payment.pk} ")
        box.press("Enter")
        page.wait_for_url(f"**/{payment.pk}/change/")
        expect(page.locator(".dp-badge").first).to_have_text("SCHEDULED")

        page.locator("#dp-global-search input[name=q]").fill(source.owner.username)
        page.locator("#dp-global-search input[name=q]").press("Enter")
        page.wait_for_url("**/auth/user/*/change/")

        page.goto("/admin/")
        page.fill("#dp-front-search-q", "no such thing at all")
        page.locator("#dp-front-search input[type=submit]").click()
        expect(page.locator("#dp-search-nothing")).to_contain_text("Nothing you may see matches")
        screenshot(page, "search-nothing")


@pytest.mark.django_db(transaction=True)
def test_accounts_list_finds_the_customer_by_account_name(live_server, browser_settings):
    staff = UserFactory(is_staff=True, is_superuser=True)
    wanted = funded_account(name="Our holiday fund")
    funded_account(name="fund for the holiday")
    funded_account(name="Rent")

    with chromium_page(live_server.url) as page:
        log_in(page, staff)
        page.goto(reverse("admin:ledger_account_changelist"))
        page.fill("#searchbar", "holiday fund")
        page.locator("#changelist-search input[type=submit]").click()
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text(wanted.pk)
        expect(rows.first).to_contain_text("Our holiday fund")
        screenshot(page, "accounts-search")


@pytest.mark.django_db(transaction=True)
def test_formatted_values_are_what_staff_read(live_server, browser_settings, settings):
    """Thousands separators on the limits page, a rule in words, a user's name where an id
    was, a failure reason as a sentence with its code, times without microseconds."""
    from datetime import timedelta

    from django.utils import timezone

    from ledger.models import DepositRequest
    from payments.promoter import claim_due
    from payments.worker import run_batch
    from recurring.services import recurring_create
    from tests.factories import due_payment

    settings.DELAYPAY_MAX_DAILY_OUTFLOW_PER_USER = 1_000_000_000_000_000
    staff = UserFactory(is_staff=True, is_superuser=True)
    alice = UserFactory(username="alice")
    poor, target = funded_account(owner=alice, balance=5, name="Holiday fund"), funded_account()
    failed = due_payment(source=poor, target=target, amount=2_500)
    run_batch(claim_due(batch=10, lease_seconds=60).fresh, worker="test")
    rec = recurring_create(payer=alice, from_account_id=poor.id, to_account_id=target.id, amount=1,
                           start_at=timezone.now() + timedelta(hours=1), interval="PT1M")
    request = DepositRequest.objects.create(account=poor, beneficiary=alice, amount=5_000, reason="top up",
                                            requested_by=staff)

    with chromium_page(live_server.url) as page:
        log_in(page, staff)
        page.goto(reverse("admin-limits"))
        expect(page.locator("#dp-caps")).to_contain_text("1,000,000,000,000,000")
        screenshot(page, "limits")

        page.goto(reverse("admin:payments_recurringpayment_change", args=[rec.pk]))
        expect(page.locator("#content")).to_contain_text("every 1 minute")

        page.goto(reverse("admin:payments_scheduledpayment_change", args=[quote(failed.pk)]))
        content = page.locator("#content")
        expect(content).to_contain_text("Insufficient funds: the sender's balance was below the amount "
                                        "(insufficient_funds)")
        expect(content).to_contain_text("2,500")
        text = content.inner_text()

        page.goto(reverse("admin:ledger_depositrequest_changelist"))
        row = page.locator("#result_list tbody tr", has_text=request.pk)
        expect(row).to_contain_text("Holiday fund")
        expect(row).to_contain_text("alice")
        expect(row).to_contain_text("5,000")
        screenshot(page, "deposit-requests")

    import re

    assert not re.search(r"\d{2}:\d{2}:\d{2}\.\d", text), "a time with fractions of a second"
