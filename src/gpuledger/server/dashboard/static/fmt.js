/* gpuledger dashboard: the CLI's number policy (core/units.py) and short run ids (core/ids.py).
 * The pages carry no data (the browser reads the JSON API), so the policy runs here; a test
 * formats thousands of values with both and compares (tests/test_dashboard_numbers.py).
 * Rounding works on decimal digit strings, as Python's Decimal does, never on binary floats. */
(function () {
  "use strict";
  var NA = "n/a", SIGNIFICANT = 3, MAX_DECIMALS = 8, TINY = "0.00000001";
  var CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz";
  var BINARY = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

  function absent(v) {
    if (v === null || v === undefined || v === "" || typeof v === "boolean") return true;
    return !isFinite(Number(v));
  }

  function zeros(n) { return new Array(n + 1).join("0"); }

  /* A number's shortest round-trip digits (as Python's repr) as a plain decimal: 1.5e-7 -> "0.00000015". */
  function shortest(v) {
    var s = String(Math.abs(v));
    var m = /^(\d)(?:\.(\d+))?e([+-]\d+)$/.exec(s);
    if (m) {
      var digits = m[1] + (m[2] || ""), point = 1 + Number(m[3]);
      if (point <= 0) s = "0." + zeros(-point) + digits;
      else if (point >= digits.length) s = digits + zeros(point - digits.length);
      else s = digits.slice(0, point) + "." + digits.slice(point);
    }
    return (v < 0 ? "-" : "") + s;
  }

  /* A number's exact binary value as a decimal (what Python's "%.Nf" rounds), for |v| < 1e21. */
  function exact(v) { return Math.abs(v) < 1e21 ? v.toFixed(100) : shortest(v); }

  function increment(digits) {
    var out = digits.split(""), i = out.length - 1;
    while (i >= 0) {
      if (out[i] === "9") { out[i] = "0"; i--; continue; }
      out[i] = String(Number(out[i]) + 1);
      return out.join("");
    }
    return "1" + out.join("");
  }

  /* A plain decimal string rounded to ``places``: "up" = half away from zero (ROUND_HALF_UP),
   * "even" = half to even (ROUND_HALF_EVEN, and Python's float formatting). -> {neg, int, frac} */
  function round(text, places, mode) {
    var neg = text.charAt(0) === "-";
    if (neg || text.charAt(0) === "+") text = text.slice(1);
    var parts = text.split("."), ip = parts[0] || "0", fp = parts[1] || "";
    while (fp.length < places + 1) fp += "0";
    var keep = ip + fp.slice(0, places), rest = fp.slice(places);
    var first = rest.charCodeAt(0) - 48, beyond = /[1-9]/.test(rest.slice(1));
    var up = mode === "up" ? first >= 5
      : first > 5 || (first === 5 && (beyond || Number(keep.charAt(keep.length - 1)) % 2 === 1));
    if (up) keep = increment(keep);
    var cut = keep.length - places;
    var whole = keep.slice(0, cut).replace(/^0+(?=\d)/, "") || "0";
    return { neg: neg, int: whole, frac: keep.slice(cut), zero: !/[1-9]/.test(keep) };
  }

  function group(int) { return int.replace(/\B(?=(\d{3})+(?!\d))/g, ","); }

  function show(r, separators) {
    var int = separators ? group(r.int) : r.int;
    return (r.neg ? "-" : "") + int + (r.frac ? "." + r.frac : "");
  }

  /* fmt_number: three significant digits, plain decimals, from 1,000 the whole integer part. */
  function number(value, sig) {
    if (absent(value)) return NA;
    sig = sig || SIGNIFICANT;
    var v = Number(value);
    if (v === 0) return "0";
    var mag = Math.abs(v);
    if (mag < 1e-8) return v > 0 ? "<" + TINY : ">-" + TINY;
    var decimals = mag >= Math.pow(10, Math.max(sig, 3)) ? 0
      : Math.min(MAX_DECIMALS, Math.max(0, sig - 1 - Math.floor(Math.log10(mag))));
    var text = shortest(v), r = round(text, decimals, "up");
    // 9.996 rounds to 10.0, not 10.00: one digit too many once the rounded value reaches 10^(sig-decimals)
    if (decimals && (r.int + r.frac).replace(/^0+/, "").length > sig) r = round(text, --decimals, "up");
    return show(r, true);
  }

  /* Python's f"{v:.{d}f}" (half to even on the exact binary value); ``separators``: f"{v:,.{d}f}". */
  function fixed(v, d, separators) {
    var r = round(exact(v), d, "even");
    r.neg = v < 0 || Object.is(v, -0);  // as Python: "-0.0" for -0.04 and for -0.0
    return show(r, separators);
  }

  /* fmt_money: cents, half to even, from the exact decimal string; "<0.01" for less than a cent. */
  function money(amount, currency) {
    if (amount === null || amount === undefined || amount === "") return NA;
    var text = typeof amount === "number" ? (isFinite(amount) ? shortest(amount) : null) : String(amount).trim();
    if (text === null) return NA;
    if (!/^[+-]?(\d+\.?\d*|\.\d+)$/.test(text)) return String(amount);
    var r = round(text, 2, "even"), nonzero = /[1-9]/.test(text);
    var out = r.zero && nonzero ? (r.neg ? ">-0.01" : "<0.01") : show(r, true);
    if (r.zero && !nonzero) out = (r.neg ? "-" : "") + "0.00";
    return currency ? out + " " + currency : out;
  }

  /* fmt_percent: a value in percent -> "78%", "4.5%", "<0.1%". */
  function percent(p) {
    if (absent(p)) return NA;
    p = Number(p);
    if (p === 0) return "0%";
    if (Math.abs(p) >= 9.95) return fixed(p, 0) + "%";
    if (Math.abs(p) < 0.05) return p > 0 ? "<0.1%" : ">-0.1%";
    return fixed(p, 1) + "%";
  }

  function pct(ratio) { return absent(ratio) ? NA : percent(Number(ratio) * 100); }

  function change(p) {
    if (absent(p)) return NA;
    p = Number(p);
    var sign = p < 0 || Object.is(p, -0) ? "" : "+";
    return Math.abs(p) >= 99.95 ? sign + fixed(p, 0, true) + "%" : sign + fixed(p, 1) + "%";
  }

  function pad2(n) { return (n < 10 ? "0" : "") + n; }

  /* fmt_duration: "0.412 s" under a minute, then h:mm:ss. */
  function duration(s) {
    if (absent(s)) return NA;
    s = Number(s);
    if (Math.abs(s) < 59.95) return number(s) + " s";
    var total = Number(round(exact(Math.abs(s)), 0, "even").int);
    var h = Math.floor(total / 3600), m = Math.floor((total % 3600) / 60), sec = total % 60;
    return (s < 0 ? "-" : "") + h + ":" + pad2(m) + ":" + pad2(sec);
  }

  function seconds(s) { return absent(s) ? NA : number(s) + " s"; }
  function gpuSeconds(s) {
    if (absent(s)) return NA;
    s = Number(s);
    return Math.abs(s) >= 3600 ? number(s / 3600) + " GPU-h" : number(s) + " GPU-s";
  }
  function kwh(v) { return absent(v) ? NA : number(v) + " kWh"; }
  function watts(v) { return absent(v) ? NA : fixed(Number(v), 0, true) + " W"; }
  function celsius(v) { return absent(v) ? NA : fixed(Number(v), 0) + " °C"; }

  function byteDecimals(size) { return Math.abs(size) < 10 ? 2 : Math.abs(size) < 100 ? 1 : 0; }

  /* fmt_bytes: binary units, three significant digits; rounded first, then the unit picked. */
  function bytes(n) {
    if (absent(n)) return NA;
    var size = Number(n), unit = 0;
    for (;;) {
      var digits = unit === 0 ? 0 : byteDecimals(size);
      var shown = Math.abs(Number(fixed(size, digits)));
      if (shown >= 1024 && unit < BINARY.length - 1) { size /= 1024; unit++; continue; }
      if (unit === 0) return fixed(size, 0) + " B";
      return fixed(size, byteDecimals(shown)) + " " + BINARY[unit];
    }
  }

  function count(n, noun, plural) {
    return group(String(n)) + " " + (n === 1 ? noun : plural || noun + "s");
  }

  /* core/ids.short_id: the last 40 bits of the id in Crockford base32, eight characters. */
  function shortId(id) {
    var tail = String(id).toLowerCase().slice(-10);
    if (!/^[0-9a-f]{10}$/.test(tail)) return String(id);
    var halves = [parseInt(tail.slice(0, 5), 16), parseInt(tail.slice(5), 16)], out = "";
    halves.forEach(function (bits) {
      for (var shift = 15; shift >= 0; shift -= 5) out += CROCKFORD.charAt((bits >> shift) & 31);
    });
    return out;
  }

  /* An axis tick: the policy's digits without trailing zeros (50, 7.5, 0.0025): ticks are round
   * numbers, and "50.0" beside "100" reads as a different precision. */
  function tick(v) {
    var text = number(v);
    return text.indexOf(".") >= 0 && text.charAt(0) !== "<" ? text.replace(/\.?0+$/, "") : text;
  }

  window.GLFmt = {
    tick: tick,
    NA: NA, number: number, money: money, percent: percent, pct: pct, change: change, duration: duration,
    seconds: seconds, gpuSeconds: gpuSeconds, hours: number, kwh: kwh, watts: watts, celsius: celsius,
    bytes: bytes, count: count, shortId: shortId,
  };
})();
