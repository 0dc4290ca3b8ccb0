// The Kubernetes manifests of deploy/k8s/ against Kubernetes 1.30's API, offline (run by
// tests/deploy/test_k8s, which installs the references into the npm cache first):
//
//   node test_k8s.mjs NODE_MODULES K8S_DIR WORK_DIR
//
// The schema: kubernetes-types 1.30.0, the API's types generated from Kubernetes 1.30's OpenAPI
// spec (one .d.ts per group/version, each field with its type and whether it is required),
// checked by the TypeScript compiler: every YAML document becomes one object literal typed as
// its kind, so an unknown field (a misspelling), a value of the wrong type (a string where an
// integer goes), a missing required field, and an apiVersion/kind that 1.30 does not serve are
// errors. Quantities are strings there ("4", "16Gi"), as the OpenAPI spec writes them.
// Beside the schema, what no schema says: kustomization.yaml names every manifest and only
// existing files, and the documents agree with one another (Services select the pods they
// serve, the StatefulSet's serviceName is its headless Service, the router's --scheduler flags
// name every engine pod, by the headless Service's DNS names and the engines' port, the
// tenants ConfigMap the router mounts is generated, a NetworkPolicy admits only the router pods
// to the engines' scheduler port and leaves the router's ports open).
// The manifests are read as YAML 1.1, as Kubernetes reads them (an unquoted `on` is a boolean).
// Then the negative cases: mutated copies of the manifests (a misspelled field, a string where
// an integer goes, a missing required field, an apiVersion 1.30 does not serve, an unquoted
// `on` where a string goes, an engine replica the router does not name, a manifest left out of
// kustomization.yaml) must each be refused with the error expected.
// Prints one line per check and "N passed, N failed"; exit 1 when any failed.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const [modules, k8sDir, work] = process.argv.slice(2);
if (!modules || !k8sDir || !work) {
    console.error("usage: node test_k8s.mjs NODE_MODULES K8S_DIR WORK_DIR");
    process.exit(2);
}
const require = createRequire(path.join(modules, "noop.js"));
const ts = require("typescript");
const YAML = require("yaml");
const typesDir = path.join(modules, "kubernetes-types");
const K8S_VERSION = JSON.parse(fs.readFileSync(path.join(typesDir, "package.json"))).version;

// ---- the schema check ------------------------------------------------------------------------

// "apps/v1" -> "apps/v1", "v1" -> "core/v1", "policy/v1" -> "policy/v1",
// "networking.k8s.io/v1" -> "networking/v1" (kubernetes-types' folders).
function typesModule(apiVersion) {
    const parts = String(apiVersion).split("/");
    if (parts.length === 1) return `core/${parts[0]}`;
    if (parts.length !== 2) return null;
    return `${parts[0].split(".")[0]}/${parts[1]}`;
}

// JSON text of v, one field per line, with the path of the field that each line starts;
// lines[i] is the path of line i + 1 of the text (for errors that name where they are).
function emit(v, indent, p, lines, out) {
    const pad = "  ".repeat(indent);
    if (Array.isArray(v)) {
        if (v.length === 0) return "[]";
        let s = "[\n";
        v.forEach((x, i) => {
            lines.push(`${p}[${i}]`);
            s += pad + "  " + emit(x, indent + 1, `${p}[${i}]`, lines) + (i + 1 < v.length ? ",\n" : "\n");
        });
        lines.push(p);
        return s + pad + "]";
    }
    if (v !== null && typeof v === "object") {
        const keys = Object.keys(v);
        if (keys.length === 0) return "{}";
        let s = "{\n";
        keys.forEach((k, i) => {
            const q = p ? `${p}.${k}` : k;
            lines.push(q);
            s += pad + "  " + JSON.stringify(k) + ": " + emit(v[k], indent + 1, q, lines) +
                (i + 1 < keys.length ? ",\n" : "\n");
        });
        lines.push(p);
        return s + pad + "}";
    }
    return JSON.stringify(v);
}

// docs: [{file, index, doc}]. Returns a list of error strings (empty: all valid).
function schemaCheck(docs, dir) {
    const errors = [];
    fs.rmSync(dir, { recursive: true, force: true });
    fs.mkdirSync(dir, { recursive: true });
    fs.symlinkSync(modules, path.join(dir, "node_modules"));
    const files = [];
    const meta = new Map();
    docs.forEach((d, n) => {
        const where = `${d.file} document ${d.index + 1}`;
        const doc = d.doc;
        if (doc === null || typeof doc !== "object" || Array.isArray(doc)) {
            errors.push(`${where}: not a mapping`);
            return;
        }
        const name = doc.metadata && doc.metadata.name;
        const label = `${where} (${doc.kind} ${name})`;
        if (typeof doc.apiVersion !== "string" || typeof doc.kind !== "string" ||
            typeof name !== "string") {
            errors.push(`${label}: apiVersion, kind and metadata.name are required`);
            return;
        }
        const mod = typesModule(doc.apiVersion);
        const dts = mod && path.join(typesDir, `${mod}.d.ts`);
        if (!dts || !fs.existsSync(dts) ||
            !new RegExp(`^export interface ${doc.kind} \\{`, "m").test(fs.readFileSync(dts, "utf8"))) {
            errors.push(`${label}: Kubernetes ${K8S_VERSION} has no ${doc.kind} in ` +
                        `${doc.apiVersion}`);
            return;
        }
        const lines = [""]; // the literal's opening brace
        const header = `import type { ${doc.kind} as T } from "kubernetes-types/${mod}";\n` +
                       `export const doc: T = `;
        const body = emit(doc, 0, "", lines);
        const file = path.join(dir, `doc${n}.ts`);
        fs.writeFileSync(file, header + body + ";\n");
        files.push(file);
        meta.set(file, { label, lines, offset: 2 }); // the literal starts on line 2
    });
    if (files.length === 0) return errors;
    const program = ts.createProgram(files, {
        noEmit: true, strict: true, target: ts.ScriptTarget.ES2020,
        module: ts.ModuleKind.CommonJS, moduleResolution: ts.ModuleResolutionKind.Node10,
        lib: ["lib.es2020.d.ts"], types: [], skipLibCheck: true,
    });
    for (const diag of ts.getPreEmitDiagnostics(program)) {
        const msg = ts.flattenDiagnosticMessageText(diag.messageText, " ");
        const m = diag.file && meta.get(path.resolve(diag.file.fileName));
        if (!m) {
            errors.push(`typescript: ${msg}`);
            continue;
        }
        const line = diag.file.getLineAndCharacterOfPosition(diag.start).line + 1;
        const at = m.lines[line - m.offset] ?? "(top)";
        errors.push(`${m.label} at ${at || "(top)"}: ${msg}`);
    }
    return errors;
}

// ---- the manifests and what no schema says ------------------------------------------------------

const KUSTOMIZATION_KEYS = new Set(["apiVersion", "kind", "resources", "configMapGenerator",
    "images", "namespace", "labels", "generatorOptions", "patches"]);

// files: {name: text} of deploy/k8s. Returns {docs, errors}.
function loadManifests(files) {
    const errors = [];
    const docs = [];
    const kz = YAML.parse(files["kustomization.yaml"] ?? "null");
    if (kz === null || typeof kz !== "object") {
        return { docs, errors: ["kustomization.yaml: missing or not a mapping"], kz: {} };
    }
    if (kz.apiVersion !== "kustomize.config.k8s.io/v1beta1" || kz.kind !== "Kustomization")
        errors.push("kustomization.yaml: not a kustomize.config.k8s.io/v1beta1 Kustomization");
    for (const k of Object.keys(kz))
        if (!KUSTOMIZATION_KEYS.has(k)) errors.push(`kustomization.yaml: unknown field ${k}`);
    const resources = kz.resources ?? [];
    for (const r of resources)
        if (!(r in files)) errors.push(`kustomization.yaml: resource ${r} does not exist`);
    for (const f of Object.keys(files).filter((f) => /\.ya?ml$/.test(f)).sort()) {
        if (f === "kustomization.yaml") continue;
        if (!resources.includes(f))
            errors.push(`kustomization.yaml: ${f} is not among its resources`);
    }
    for (const g of kz.configMapGenerator ?? []) {
        for (const f of g.files ?? []) {
            const src = f.includes("=") ? f.split("=")[1] : f;
            if (!(src in files)) errors.push(`kustomization.yaml: ${g.name}: ${src} does not exist`);
            else if (src.endsWith(".json")) {
                try { JSON.parse(files[src]); } catch (e) {
                    errors.push(`${src}: not JSON: ${e.message}`);
                }
            }
        }
    }
    for (const r of resources) {
        if (!(r in files)) continue;
        let all;
        try {
            // YAML 1.1, as Kubernetes reads it (sigs.k8s.io/yaml): an unquoted on, yes or off
            // is a boolean there, not a string.
            all = YAML.parseAllDocuments(files[r], { version: "1.1" });
        } catch (e) {
            errors.push(`${r}: ${e.message}`);
            continue;
        }
        all.forEach((d, index) => {
            for (const e of d.errors) errors.push(`${r} document ${index + 1}: ${e.message}`);
            const doc = d.toJS();
            if (doc !== null) docs.push({ file: r, index, doc });
        });
    }
    return { docs, errors, kz };
}

function selects(selector, labels) {
    return selector && Object.keys(selector).length > 0 &&
        Object.entries(selector).every(([k, v]) => labels && labels[k] === v);
}

function flagValues(args, flag) {
    const out = [];
    (args ?? []).forEach((a, i) => { if (a === flag) out.push(args[i + 1]); });
    return out;
}

function consistencyCheck(docs, kz) {
    const errors = [];
    const of = (kind) => docs.map((d) => d.doc).filter((d) => d && d.kind === kind);
    const workloads = [...of("StatefulSet"), ...of("Deployment")];
    const services = of("Service");
    const sts = of("StatefulSet").find((d) => d.metadata.name === "pagoda-engine");
    const router = of("Deployment").find((d) => d.metadata.name === "pagoda-router");
    if (!sts) errors.push("no StatefulSet pagoda-engine");
    if (!router) errors.push("no Deployment pagoda-router");
    if (!sts || !router) return errors;
    for (const w of workloads) {
        const labels = w.spec?.template?.metadata?.labels;
        if (!selects(w.spec?.selector?.matchLabels, labels))
            errors.push(`${w.kind} ${w.metadata.name}: its selector does not select its pods`);
    }
    for (const s of services) {
        if (!workloads.some((w) => selects(s.spec?.selector, w.spec?.template?.metadata?.labels)))
            errors.push(`Service ${s.metadata.name}: selects no pod of these manifests`);
    }
    for (const p of of("PodDisruptionBudget")) {
        if (!workloads.some((w) => selects(p.spec?.selector?.matchLabels,
                                           w.spec?.template?.metadata?.labels)))
            errors.push(`PodDisruptionBudget ${p.metadata.name}: selects no pod`);
    }
    const headless = services.find((s) => s.metadata.name === sts.spec.serviceName);
    if (!headless || headless.spec.clusterIP !== "None")
        errors.push(`StatefulSet pagoda-engine: serviceName ${sts.spec.serviceName} is not a ` +
                    `headless Service of these manifests`);
    const engine = sts.spec.template.spec.containers[0];
    const listen = flagValues(engine.args, "--scheduler-listen")[0] ?? "";
    const port = Number((/^tcp:\/\/0\.0\.0\.0:([0-9]+)$/.exec(listen) ?? [])[1]);
    if (!port) errors.push(`engine: --scheduler-listen ${listen} is not tcp://0.0.0.0:PORT`);
    if (!(engine.ports ?? []).some((p) => p.containerPort === port))
        errors.push(`engine: no containerPort ${port} (its --scheduler-listen)`);
    if (flagValues(engine.args, "--role")[0] !== "engine") errors.push("engine: not --role engine");
    const r = router.spec.template.spec.containers[0];
    if (flagValues(r.args, "--role")[0] !== "router") errors.push("router: not --role router");
    const want = [];
    for (let i = 0; i < (sts.spec.replicas ?? 1); i++)
        want.push(`tcp://${sts.metadata.name}-${i}.${sts.spec.serviceName}:${port}`);
    const got = flagValues(r.args, "--scheduler");
    if (JSON.stringify(got) !== JSON.stringify(want))
        errors.push(`router: its --scheduler flags (${got.join(" ")}) must name the ` +
                    `${want.length} engine pods in order: ${want.join(" ")}`);
    // The links are unauthenticated: the engines' port admits the router pods only, and the
    // router's ports stay open to clients.
    const rlabels = router.spec.template.metadata.labels;
    const policies = of("NetworkPolicy");
    const onEngine = policies.filter((p) => selects(p.spec?.podSelector?.matchLabels,
                                                    sts.spec.template.metadata.labels));
    if (onEngine.length === 0) errors.push("no NetworkPolicy selects the engine pods");
    for (const p of onEngine) {
        if (!(p.spec.policyTypes ?? []).includes("Ingress"))
            errors.push(`NetworkPolicy ${p.metadata.name}: not an Ingress policy`);
        for (const rule of p.spec.ingress ?? []) {
            const from = rule.from ?? [];
            if (from.length === 0 || !from.every((f) => !f.ipBlock && !f.namespaceSelector &&
                                                       selects(f.podSelector?.matchLabels, rlabels)))
                errors.push(`NetworkPolicy ${p.metadata.name}: an ingress rule admits more ` +
                            "than the router pods");
            const ports = (rule.ports ?? []).map((x) => x.port);
            if (ports.length === 0 || ports.some((x) => x !== port && x !== "scheduler"))
                errors.push(`NetworkPolicy ${p.metadata.name}: an ingress rule opens more than ` +
                            `the scheduler port ${port}`);
        }
    }
    const onRouter = policies.filter((p) => selects(p.spec?.podSelector?.matchLabels, rlabels));
    for (const cp of r.ports ?? []) {
        if (onRouter.length && !onRouter.some((p) => (p.spec.ingress ?? []).some((rule) =>
            (rule.ports ?? []).some((x) => x.port === cp.containerPort || x.port === cp.name))))
            errors.push(`NetworkPolicy: the router's port ${cp.containerPort} is not admitted`);
    }
    const generated = new Set((kz.configMapGenerator ?? []).map((g) => g.name));
    for (const w of workloads) {
        for (const v of w.spec.template.spec.volumes ?? []) {
            if (v.configMap && !generated.has(v.configMap.name))
                errors.push(`${w.kind} ${w.metadata.name}: ConfigMap ${v.configMap.name} is ` +
                            "not generated by kustomization.yaml");
        }
        for (const c of w.spec.template.spec.containers) {
            const images = new Set((kz.images ?? []).map((i) => i.name));
            if (!images.has(c.image))
                errors.push(`${w.kind} ${w.metadata.name}: image ${c.image} is not set by ` +
                            "kustomization.yaml's images");
        }
    }
    return errors;
}

function checkAll(files, dir) {
    const { docs, errors, kz } = loadManifests(files);
    if (errors.length) return { docs, errors };
    const e2 = schemaCheck(docs, dir);
    if (e2.length) return { docs, errors: e2 };
    return { docs, errors: consistencyCheck(docs, kz) };
}

// ---- the run -----------------------------------------------------------------------------------

let passed = 0, failed = 0;
function ok(what) { passed++; console.log(`ok   ${what}`); }
function bad(what, detail) {
    failed++;
    console.log(`FAIL ${what}`);
    for (const d of [].concat(detail ?? [])) console.log(`     ${d}`);
}

const files = {};
for (const f of fs.readdirSync(k8sDir)) {
    const p = path.join(k8sDir, f);
    if (fs.statSync(p).isFile()) files[f] = fs.readFileSync(p, "utf8");
}

const real = checkAll(files, path.join(work, "real"));
const kinds = real.docs.map((d) => `${d.doc.kind}/${d.doc.metadata?.name}`).sort();
if (real.errors.length === 0) ok(`deploy/k8s is valid for Kubernetes ${K8S_VERSION}: ${kinds.join(", ")}`);
else bad(`deploy/k8s is valid for Kubernetes ${K8S_VERSION}`, real.errors);
for (const want of ["StatefulSet/pagoda-engine", "Deployment/pagoda-router",
                    "Service/pagoda-engine", "Service/pagoda", "PodDisruptionBudget/pagoda-engine",
                    "NetworkPolicy/pagoda-engine", "NetworkPolicy/pagoda-router"]) {
    if (kinds.includes(want)) ok(`the manifests hold ${want}`);
    else bad(`the manifests hold ${want}`);
}

// Each mutation: the file, the text replaced (it must be there: a mutation that changes
// nothing would prove nothing), its replacement, and a pattern the errors must match.
const mutations = [
    ["a misspelled field", "engine.yaml", "  serviceName: pagoda-engine",
     "  serviceNmae: pagoda-engine", /serviceNmae.*does not exist in type 'StatefulSetSpec'/],
    ["a string where an integer goes", "engine.yaml", "containerPort: 7460",
     'containerPort: "7460"', /ports\[0\]\.containerPort: Type 'string' is not assignable to type 'number'/],
    ["a number where a quantity (string) goes", "router.yaml", "memory: 4Gi", "memory: 4",
     /limits\.memory: Type 'number' is not assignable to type 'string'/],
    ["a missing required field (a container's name)", "router.yaml", "- name: router\n",
     "- tty: false\n", /Property 'name' is missing/],
    ["an apiVersion that 1.30 does not serve", "router.yaml", "apiVersion: apps/v1",
     "apiVersion: apps/v1beta1", /has no Deployment in apps\/v1beta1/],
    ["a misspelled field in a probe", "engine.yaml", "periodSeconds: 20", "periodSecond: 20",
     /periodSecond.*does not exist in type 'Probe'/],
    ["an unquoted on (a YAML 1.1 boolean) where a string goes", "engine.yaml",
     "            - cuda\n", "            - on\n",
     /args\[5\]: Type 'boolean' is not assignable to type 'string'/],
    ["an engine that the router does not name", "engine.yaml", "replicas: 2", "replicas: 3",
     /--scheduler flags .* must name the 3 engine pods/],
    ["a manifest left out of kustomization.yaml", "kustomization.yaml", "  - router.yaml\n", "",
     /router\.yaml is not among its resources/],
    ["the NetworkPolicy left out of kustomization.yaml", "kustomization.yaml",
     "  - networkpolicy.yaml\n", "", /networkpolicy\.yaml is not among its resources/],
    ["an engine policy that admits any pod", "networkpolicy.yaml",
     "    - from:\n        - podSelector:\n            matchLabels:\n" +
     "              app.kubernetes.io/name: pagoda\n              app.kubernetes.io/component: router\n      ports:",
     "    - ports:", /pagoda-engine: an ingress rule admits more than the router pods/],
    ["an engine policy that opens another port", "networkpolicy.yaml",
     "        - port: 7460\n", "        - port: 7460\n        - port: 7450\n",
     /pagoda-engine: an ingress rule opens more than the scheduler port 7460/],
    ["a router policy that shuts its API port", "networkpolicy.yaml",
     "        - port: 8000\n          protocol: TCP\n", "",
     /the router's port 8000 is not admitted/],
];
mutations.forEach(([what, file, from, to, expect], i) => {
    const what2 = `refused: ${what} (${file})`;
    if (!files[file] || !files[file].includes(from)) {
        bad(what2, `the text to mutate is not in ${file}: ${JSON.stringify(from)}`);
        return;
    }
    const copy = { ...files, [file]: files[file].replace(from, to) };
    const { errors } = checkAll(copy, path.join(work, `mutated${i}`));
    if (errors.some((e) => expect.test(e))) ok(`${what2}: ${errors.find((e) => expect.test(e))}`);
    else bad(what2, errors.length ? ["other errors:", ...errors] : "accepted");
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
