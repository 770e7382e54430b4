// A small offline reader of /openapi.json: every endpoint, its request fields with their constraints.
"use strict";

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function resolve(spec, schema) {
  while (schema && schema.$ref) schema = spec.components.schemas[schema.$ref.split("/").pop()];
  return schema || {};
}

function typeOf(spec, s) {
  s = resolve(spec, s);
  if (s.enum) return s.enum.map((v) => JSON.stringify(v)).join(" | ");
  if (s.anyOf) return s.anyOf.map((x) => typeOf(spec, x)).join(" | ");
  if (s.type === "array") return `array of ${typeOf(spec, s.items || {})}`;
  return s.type || "object";
}

function limits(s) {
  return limitList(s).join(", ");
}

function limitList(s) {
  const out = [];
  for (const [k, label] of [["minimum", "≥"], ["maximum", "≤"], ["minLength", "length ≥"], ["maxLength", "length ≤"],
    ["minItems", "items ≥"], ["maxItems", "items ≤"]]) {
    if (s[k] !== undefined) out.push(`${label} ${s[k]}`);
  }
  for (const x of s.anyOf || []) out.push(...limitList(x));
  return out;
}

function fieldsTable(spec, schema) {
  schema = resolve(spec, schema);
  const t = el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "field"), el("th", {}, "type"),
    el("th", {}, "default"), el("th", {}, "limits"), el("th", {}, "description"))));
  const body = el("tbody");
  const required = new Set(schema.required || []);
  for (const [name, prop] of Object.entries(schema.properties || {})) {
    const p = resolve(spec, prop);
    const dflt = prop.default !== undefined ? JSON.stringify(prop.default) : (required.has(name) ? "required" : "");
    body.append(el("tr", {}, el("td", {}, el("code", {}, name)), el("td", {}, typeOf(spec, prop)), el("td", {}, dflt),
      el("td", {}, limits(prop)), el("td", {}, prop.description || p.description || "")));
  }
  t.append(body);
  return t;
}

async function main() {
  const spec = await (await fetch("/openapi.json")).json();
  const box = document.getElementById("docs");
  box.replaceChildren(el("p", {}, `${spec.info.title} ${spec.info.version}: ${spec.info.description || ""}`));
  for (const [path, ops] of Object.entries(spec.paths)) {
    for (const [method, op] of Object.entries(ops)) {
      const section = el("section", { class: "endpoint" }, el("h2", {}, el("code", {}, `${method.toUpperCase()} ${path}`)));
      if (op.description || op.summary) section.append(el("p", {}, op.description || op.summary));
      const req = op.requestBody && op.requestBody.content["application/json"];
      if (req) section.append(el("h3", {}, "request body (JSON)"), fieldsTable(spec, req.schema));
      const ok = op.responses && op.responses["200"] && op.responses["200"].content;
      const schema = ok && ok["application/json"] && resolve(spec, ok["application/json"].schema);
      if (schema && schema.properties) section.append(el("h3", {}, "response (JSON)"), fieldsTable(spec, schema));
      box.append(section);
    }
  }
  box.append(el("p", {}, "Errors: 422 (bad input) and 404 (unknown model or GPU, with suggestions) answer ",
    el("code", {}, '{"error": "...", "field": "...", "detail": [...]}'), "; a body over 1 MiB is answered 413."));
}

main().catch((e) => { document.getElementById("docs").textContent = `could not load /openapi.json: ${e.message}`; });
