// Times as people read them: "3 min ago" in the text, the local date and time on hover.

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

// "just now", "3 min ago", "2 hours ago", "yesterday", "4 days ago", then a date ("12 Mar",
// with the year when it is not this year). `iso` is an ISO 8601 instant; anything unreadable
// is shown as given.
export function relativeTime(iso, now = Date.now()) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return String(iso);
  const ago = now - t;
  if (ago < MINUTE) return "just now"; // also a server clock slightly ahead of this one
  if (ago < HOUR) return `${Math.floor(ago / MINUTE)} min ago`;
  if (ago < DAY) {
    const h = Math.floor(ago / HOUR);
    return `${h} hour${h > 1 ? "s" : ""} ago`;
  }
  const d = Math.floor(ago / DAY);
  if (d === 1) return "yesterday";
  if (d < 7) return `${d} days ago`;
  const date = new Date(t);
  const opts = { day: "numeric", month: "short" };
  if (date.getFullYear() !== new Date(now).getFullYear()) opts.year = "numeric";
  return date.toLocaleDateString(undefined, opts);
}

// The local date and time with its zone, e.g. "Dec 1, 2026, 12:34:56 PM GMT+9".
export function localTime(iso) {
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return String(iso);
  return new Date(t).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "long" });
}

// A <time> element reading `iso` relatively, kept current by tickTimes().
export function timeEl(iso) {
  const el = document.createElement("time");
  el.className = "when";
  setTime(el, iso);
  return el;
}

// Point a <time> element made by timeEl at `iso`; nothing changes when it already reads it.
export function setTime(el, iso) {
  if (el.dateTime === iso) return;
  el.dateTime = iso;
  el.title = localTime(iso);
  el.textContent = relativeTime(iso);
}

// Re-read every relative time on the page (called once a minute).
export function tickTimes() {
  const now = Date.now();
  for (const el of document.querySelectorAll("time.when")) {
    el.textContent = relativeTime(el.dateTime, now);
  }
}
