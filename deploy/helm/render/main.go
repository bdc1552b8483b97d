// Command render does what `helm template RELEASE CHART` does for a chart without
// dependencies, hooks or CRDs (such as deploy/helm/keel), built only from what Debian packages:
// Helm itself is in neither Debian nor PyPI, but its template engine is Go's text/template with
// Sprig's functions and sigs.k8s.io/yaml, all three of which Debian ships. Each piece below
// follows the Helm 3 source it names, so the output is the one `helm template` prints.
//
// Usage:
//
//	render RELEASE CHART_DIR [--namespace NS] [-f values.yaml]... [--set k=v]... [--set-string k=v]...
//
// Build (Debian: golang-go golang-github-masterminds-sprig-dev golang-k8s-sigs-yaml-dev):
//
//	cd deploy/helm/render && GO111MODULE=off GOPATH=/usr/share/gocode go build -o /tmp/render .
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	// Debian's GOPATH paths of Sprig v3 and semver v3 (GOPATH mode has no /v3 suffix).
	"github.com/Masterminds/semver"
	"github.com/Masterminds/sprig"
	"sigs.k8s.io/yaml"
)

func main() {
	out, err := run(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
	fmt.Print(out)
}

// options are the `helm template` flags this renderer takes.
type options struct {
	release, chartDir, namespace string
	valueFiles                   []string
	// sets holds --set and --set-string in command-line order; helm applies all --set
	// before all --set-string (pkg/cli/values/options.go), which run() keeps.
	sets, setStrings []string
}

func parseArgs(args []string) (options, error) {
	// kubectl's default namespace, which helm uses when none is given.
	o := options{namespace: "default"}
	var positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, inline := strings.Cut(a, "=")
		if !strings.HasPrefix(a, "-") {
			positional = append(positional, a)
			continue
		}
		if !inline {
			if i+1 >= len(args) {
				return o, fmt.Errorf("flag %s needs a value", a)
			}
			i++
			value = args[i]
		}
		switch name {
		case "-n", "--namespace":
			o.namespace = value
		case "-f", "--values":
			o.valueFiles = append(o.valueFiles, value)
		case "--set":
			o.sets = append(o.sets, value)
		case "--set-string":
			o.setStrings = append(o.setStrings, value)
		default:
			return o, fmt.Errorf("unknown flag %s", name)
		}
	}
	if len(positional) != 2 {
		return o, fmt.Errorf("usage: render RELEASE CHART_DIR [--namespace NS] [-f FILE]... [--set K=V]... [--set-string K=V]...")
	}
	o.release, o.chartDir = positional[0], positional[1]
	return o, nil
}

// chartMetadata is the part of Helm's chart.Metadata (pkg/chart/metadata.go) that templates read
// as .Chart; the field names are Helm's, so `.Chart.AppVersion` means the same thing.
type chartMetadata struct {
	APIVersion   string            `json:"apiVersion"`
	Name         string            `json:"name"`
	Version      string            `json:"version"`
	AppVersion   string            `json:"appVersion,omitempty"`
	Description  string            `json:"description,omitempty"`
	Type         string            `json:"type,omitempty"`
	Home         string            `json:"home,omitempty"`
	Icon         string            `json:"icon,omitempty"`
	Keywords     []string          `json:"keywords,omitempty"`
	Sources      []string          `json:"sources,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	Deprecated   bool              `json:"deprecated,omitempty"`
	KubeVersion  string            `json:"kubeVersion,omitempty"`
	Dependencies []interface{}     `json:"dependencies,omitempty"`
}

// Helm's chartutil.ValidateReleaseName: a DNS-1123 subdomain of at most 53 characters.
var releaseName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

func run(args []string) (string, error) {
	o, err := parseArgs(args)
	if err != nil {
		return "", err
	}
	if !releaseName.MatchString(o.release) || len(o.release) > 53 {
		return "", fmt.Errorf("invalid release name %q: a DNS-1123 subdomain of at most 53 characters", o.release)
	}
	meta, err := loadMetadata(o.chartDir)
	if err != nil {
		return "", err
	}
	values, err := loadValues(o, meta)
	if err != nil {
		return "", err
	}
	templates, err := loadTemplates(o.chartDir, meta.Name)
	if err != nil {
		return "", err
	}
	// chartutil.ToRenderValues with the options `helm template` passes (install, revision 1).
	top := map[string]interface{}{
		"Values": values,
		"Chart":  meta,
		"Release": map[string]interface{}{
			"Name":      o.release,
			"Namespace": o.namespace,
			"IsUpgrade": false,
			"IsInstall": true,
			"Revision":  1,
			"Service":   "Helm",
		},
	}
	rendered, err := render(templates, top, meta.Name+"/templates")
	if err != nil {
		return "", err
	}
	return manifest(rendered)
}

func loadMetadata(dir string) (*chartMetadata, error) {
	data, err := os.ReadFile(filepath.Join(dir, "Chart.yaml"))
	if err != nil {
		return nil, err
	}
	meta := &chartMetadata{}
	if err := yaml.Unmarshal(data, meta); err != nil {
		return nil, fmt.Errorf("Chart.yaml: %v", err)
	}
	// The checks of Helm's Metadata.Validate that apply here.
	if meta.APIVersion != "v1" && meta.APIVersion != "v2" {
		return nil, fmt.Errorf("Chart.yaml: apiVersion %q is neither v1 nor v2", meta.APIVersion)
	}
	if meta.Name == "" {
		return nil, fmt.Errorf("Chart.yaml: name is required")
	}
	if _, err := semver.NewVersion(meta.Version); err != nil {
		return nil, fmt.Errorf("Chart.yaml: version %q is not SemVer 2", meta.Version)
	}
	if meta.Type == "library" {
		return nil, fmt.Errorf("library charts are not installable")
	}
	// What this renderer leaves out must not be silently skipped: each would change the output.
	if len(meta.Dependencies) > 0 || exists(filepath.Join(dir, "charts")) {
		return nil, fmt.Errorf("chart dependencies (subcharts) are not supported")
	}
	if exists(filepath.Join(dir, "crds")) || exists(filepath.Join(dir, "values.schema.json")) {
		return nil, fmt.Errorf("crds/ and values.schema.json are not supported")
	}
	if meta.KubeVersion != "" {
		return nil, fmt.Errorf("Chart.yaml: kubeVersion constraints are not checked by this renderer")
	}
	return meta, nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// readYAMLMap reads a values file the way Helm does, through sigs.k8s.io/yaml: YAML becomes
// JSON first, so every number is a float64 (why charts write `int .Values.x`).
func readYAMLMap(p string) (map[string]interface{}, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	m := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("failed to parse %s: %v", p, err)
	}
	if m == nil {
		m = map[string]interface{}{}
	}
	return m, nil
}

// loadValues is pkg/cli/values Options.MergeValues (-f files merged in order, then --set, then
// --set-string) followed by chartutil.CoalesceValues with the chart's values.yaml underneath.
func loadValues(o options, meta *chartMetadata) (map[string]interface{}, error) {
	user := map[string]interface{}{}
	for _, f := range o.valueFiles {
		m, err := readYAMLMap(f)
		if err != nil {
			return nil, err
		}
		user = mergeMaps(user, m)
	}
	for _, s := range o.sets {
		if err := parseSet(s, user, false); err != nil {
			return nil, fmt.Errorf("failed parsing --set data: %v", err)
		}
	}
	for _, s := range o.setStrings {
		if err := parseSet(s, user, true); err != nil {
			return nil, fmt.Errorf("failed parsing --set-string data: %v", err)
		}
	}
	defaults, err := readYAMLMap(filepath.Join(o.chartDir, "values.yaml"))
	if err != nil {
		return nil, err
	}
	return coalesce(user, defaults, meta.Name), nil
}

// mergeMaps is Helm's: b's keys win, tables present on both sides merge recursively.
func mergeMaps(a, b map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if vt, ok := v.(map[string]interface{}); ok {
			if at, ok := out[k].(map[string]interface{}); ok {
				out[k] = mergeMaps(at, vt)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// coalesce lays the user's values over the chart's defaults as chartutil's
// coalesceTablesFullKey does: the user's value wins (with Helm's warning where a table meets a
// non-table), tables merge, and a user null deletes the key. prefix names the table in warnings.
func coalesce(user, defaults map[string]interface{}, prefix string) map[string]interface{} {
	for k, dv := range defaults {
		uv, ok := user[k]
		fullKey := prefix + "." + k
		ut, uIsTable := uv.(map[string]interface{})
		dt, dIsTable := dv.(map[string]interface{})
		switch {
		case !ok:
			user[k] = dv
		case uv == nil:
			delete(user, k)
		case uIsTable && dIsTable:
			coalesce(ut, dt, fullKey)
		case dIsTable:
			fmt.Fprintf(os.Stderr, "warning: cannot overwrite table with non table for %s (%v)\n", fullKey, dv)
		case uIsTable && dv != nil:
			fmt.Fprintf(os.Stderr, "warning: destination for %s is a table. Ignoring non-table value (%v)\n", fullKey, dv)
		}
	}
	return user
}

// parseSet applies one --set (or --set-string) argument to vals, as Helm's pkg/strvals does for
// the forms `a.b=v`, `a=v1,b=v2` and `a={x,y}`, with `\` escaping the next character.
// The list-index form `a[0]=v` is refused rather than misread.
func parseSet(s string, vals map[string]interface{}, asString bool) error {
	r := []rune(s)
	i := 0
	for i < len(r) {
		var keyPath []string
		for {
			k, stop := scanUntil(r, &i, "=.[,")
			keyPath = append(keyPath, k)
			if stop == '.' {
				continue
			}
			if stop == '=' {
				break
			}
			if stop == '[' {
				return fmt.Errorf("list index syntax (%s[...]) is not supported", strings.Join(keyPath, "."))
			}
			return fmt.Errorf("key %q has no value", strings.Join(keyPath, "."))
		}
		var val interface{}
		if i < len(r) && r[i] == '{' {
			i++
			list := []interface{}{}
			if i < len(r) && r[i] == '}' {
				i++
			} else {
				for {
					item, stop := scanUntil(r, &i, ",}")
					list = append(list, typedVal(item, asString))
					if stop == '}' {
						break
					}
					if stop == 0 {
						return fmt.Errorf("list must terminate with '}'")
					}
				}
			}
			if i < len(r) {
				if r[i] != ',' {
					return fmt.Errorf("unexpected %q after a list", r[i])
				}
				i++
			}
			val = list
		} else {
			v, _ := scanUntil(r, &i, ",")
			val = typedVal(v, asString)
		}
		m := vals
		for _, k := range keyPath[:len(keyPath)-1] {
			next, ok := m[k].(map[string]interface{})
			if !ok {
				next = map[string]interface{}{}
				m[k] = next
			}
			m = next
		}
		m[keyPath[len(keyPath)-1]] = val
	}
	return nil
}

// scanUntil reads runes up to the first unescaped rune of stops (returned, 0 at the end).
func scanUntil(r []rune, i *int, stops string) (string, rune) {
	var out []rune
	for *i < len(r) {
		c := r[*i]
		*i++
		if c == '\\' && *i < len(r) {
			out = append(out, r[*i])
			*i++
			continue
		}
		if strings.ContainsRune(stops, c) {
			return string(out), c
		}
		out = append(out, c)
	}
	return string(out), 0
}

// typedVal is strvals.typedVal: --set makes true/false booleans, null a nil, and decimal
// integers not starting with 0 int64; everything else (and all of --set-string) stays a string.
func typedVal(val string, asString bool) interface{} {
	if asString {
		return val
	}
	switch {
	case strings.EqualFold(val, "true"):
		return true
	case strings.EqualFold(val, "false"):
		return false
	case strings.EqualFold(val, "null"):
		return nil
	case val == "0":
		return int64(0)
	}
	if len(val) != 0 && val[0] != '0' {
		if n, err := strconv.ParseInt(val, 10, 64); err == nil {
			return n
		}
	}
	return val
}

// loadTemplates reads every file under templates/, named as Helm names them
// ("<chart>/templates/<path>"), skipping hidden files as Helm's default .helmignore rule does.
func loadTemplates(dir, chartName string) (map[string]string, error) {
	root := filepath.Join(dir, "templates")
	templates := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), ".") && p != root {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		templates[path.Join(chartName, "templates", filepath.ToSlash(rel))] = string(data)
		return nil
	})
	return templates, err
}

// funcMap is pkg/engine/funcs.go's funcMap: Sprig's text functions without the two that read
// the environment, plus Helm's YAML/JSON helpers. include, tpl, required, fail and lookup are
// added by render() as Helm's initFunMap adds them. (toToml is left out: it needs one more
// package and the chart does not use it; a template calling it fails to parse.)
func funcMap() template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")
	extra := template.FuncMap{
		"toYaml":        toYAML,
		"fromYaml":      fromYAML,
		"fromYamlArray": fromYAMLArray,
		"toJson":        toJSON,
		"fromJson":      fromJSON,
		"fromJsonArray": fromJSONArray,
	}
	for k, v := range extra {
		f[k] = v
	}
	return f
}

// toYAML swallows errors inside a template, as Helm's does, and drops the final newline so
// `toYaml x | nindent n` leaves no blank line.
func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(str string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromYAMLArray(str string) []interface{} {
	a := []interface{}{}
	if err := yaml.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(str string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromJSONArray(str string) []interface{} {
	a := []interface{}{}
	if err := json.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

// Helm's bound on include's self-reference (pkg/engine/engine.go recursionMaxNums).
const recursionMaxNums = 1000

// includeFun is Helm's: it executes a named template into a string, so its output can be piped
// (`include "x" . | nindent 4`), which text/template's own `template` action cannot.
func includeFun(t *template.Template, includedNames map[string]int) func(string, interface{}) (string, error) {
	return func(name string, data interface{}) (string, error) {
		if includedNames[name] > recursionMaxNums {
			return "", fmt.Errorf("rendering template has a nested reference name: %s", name)
		}
		includedNames[name]++
		var buf strings.Builder
		err := t.ExecuteTemplate(&buf, name, data)
		includedNames[name]--
		return buf.String(), err
	}
}

// tplFun is Helm's: it renders a string as a template against a clone of the chart's templates,
// so the string can include the chart's named templates, and re-binds include/tpl to the clone.
func tplFun(parent *template.Template, includedNames map[string]int) func(string, interface{}) (string, error) {
	return func(text string, vals interface{}) (string, error) {
		t, err := parent.Clone()
		if err != nil {
			return "", fmt.Errorf("cannot clone template: %v", err)
		}
		// Clone does not keep the missingkey option (golang/go#43022); Helm sets it again.
		t.Option("missingkey=zero")
		t.Funcs(template.FuncMap{
			"include": includeFun(t, includedNames),
			"tpl":     tplFun(t, includedNames),
		})
		t, err = t.New(parent.Name()).Parse(text)
		if err != nil {
			return "", fmt.Errorf("cannot parse template %q: %v", text, err)
		}
		var buf strings.Builder
		if err := t.Execute(&buf, vals); err != nil {
			return "", fmt.Errorf("error during tpl function execution for %q: %v", text, err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
}

// byPathLen is Helm's template parse order (pkg/engine sortTemplates): deeper paths first, then
// reverse lexical, which decides which `define` wins when two files define the same name.
type byPathLen []string

func (p byPathLen) Len() int      { return len(p) }
func (p byPathLen) Swap(i, j int) { p[i], p[j] = p[j], p[i] }
func (p byPathLen) Less(i, j int) bool {
	a, b := p[i], p[j]
	ca, cb := strings.Count(a, "/"), strings.Count(b, "/")
	if ca == cb {
		return a < b
	}
	return ca < cb
}

// render is pkg/engine Engine.render: every file is parsed into one template set (so defines
// are shared), then every file not starting with "_" is executed with missingkey=zero, and the
// "<no value>" text/template still prints for missing map keys is removed.
func render(templates map[string]string, top map[string]interface{}, basePath string) (map[string]string, error) {
	t := template.New("gotpl")
	t.Option("missingkey=zero")
	includedNames := map[string]int{}
	funcs := funcMap()
	funcs["include"] = includeFun(t, includedNames)
	funcs["tpl"] = tplFun(t, includedNames)
	funcs["required"] = func(warn string, val interface{}) (interface{}, error) {
		if val == nil {
			return val, fmt.Errorf("%s", warnWrap(warn))
		} else if s, ok := val.(string); ok && s == "" {
			return val, fmt.Errorf("%s", warnWrap(warn))
		}
		return val, nil
	}
	funcs["fail"] = func(msg string) (string, error) {
		return "", fmt.Errorf("%s", warnWrap(msg))
	}
	// `helm template` has no cluster to look anything up in: Helm's placeholder returns an empty map.
	funcs["lookup"] = func(string, string, string, string) (map[string]interface{}, error) {
		return map[string]interface{}{}, nil
	}
	t.Funcs(funcs)

	names := make([]string, 0, len(templates))
	for name := range templates {
		names = append(names, name)
	}
	sort.Sort(sort.Reverse(byPathLen(names)))
	for _, name := range names {
		if _, err := t.New(name).Parse(templates[name]); err != nil {
			return nil, fmt.Errorf("parse error in %s: %v", name, err)
		}
	}
	rendered := map[string]string{}
	for _, name := range names {
		if strings.HasPrefix(path.Base(name), "_") {
			continue
		}
		vals := map[string]interface{}{}
		for k, v := range top {
			vals[k] = v
		}
		vals["Template"] = map[string]interface{}{"Name": name, "BasePath": basePath}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, name, vals); err != nil {
			return nil, reformatExecErrorMsg(name, err)
		}
		rendered[name] = strings.ReplaceAll(buf.String(), "<no value>", "")
	}
	return rendered, nil
}

// required and fail mark their message so that the error text/template wraps it in can be
// cut back to "execution error at (file:line:col): message" (pkg/engine warnWrap).
const warnStartDelim, warnEndDelim = "HELM_ERR_START", "HELM_ERR_END"

var warnRegex = regexp.MustCompile(warnStartDelim + `((?s).*)` + warnEndDelim)

func warnWrap(warn string) string { return warnStartDelim + warn + warnEndDelim }

// reformatExecErrorMsg is Helm's: other execution errors are text/template's own message.
func reformatExecErrorMsg(filename string, err error) error {
	if _, isExecError := err.(template.ExecError); !isExecError {
		return err
	}
	tokens := strings.SplitN(err.Error(), ": ", 3)
	if len(tokens) != 3 {
		return fmt.Errorf("execution error in (%s): %s", filename, err)
	}
	if parts := warnRegex.FindStringSubmatch(tokens[2]); len(parts) >= 2 {
		return fmt.Errorf("execution error at (%s): %s", tokens[1], parts[1])
	}
	return err
}

// Helm's document separator (pkg/releaseutil SplitManifests).
var sep = regexp.MustCompile(`(?:^|\s*\n)---\s*`)

// installOrder is releaseutil.InstallOrder: helm prints (and installs) manifests by kind in this
// order, kinds not listed last in alphabetical order, keeping file order within a kind.
var installOrder = []string{
	"PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange",
	"PodSecurityPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList",
	"ConfigMap", "StorageClass", "PersistentVolume", "PersistentVolumeClaim",
	"CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
	"ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service",
	"DaemonSet", "Pod", "ReplicationController", "ReplicaSet", "Deployment",
	"HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob", "IngressClass", "Ingress",
	"APIService",
}

// head is releaseutil.SimpleHead: what helm reads of each document to sort it.
type head struct {
	Kind     string `json:"kind"`
	Metadata *struct {
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata"`
}

type doc struct {
	source, content, kind string
}

// manifest is what action.renderResources and `helm template` print: files in lexical order
// split into documents, each parsed (a YAML error fails the render, as in helm), sorted by kind,
// each preceded by "---" and a "# Source:" line, the whole trimmed with one final newline.
func manifest(rendered map[string]string) (string, error) {
	files := make([]string, 0, len(rendered))
	for name := range rendered {
		files = append(files, name)
	}
	sort.Strings(files)
	var docs []doc
	for _, name := range files {
		content := rendered[name]
		// NOTES.txt is rendered (so its errors count) but printed by helm install, not here.
		if strings.HasSuffix(name, "NOTES.txt") || strings.TrimSpace(content) == "" {
			continue
		}
		for _, d := range sep.Split(strings.TrimSpace(content), -1) {
			if d == "" {
				continue
			}
			d = strings.TrimSpace(d)
			var h head
			if err := yaml.Unmarshal([]byte(d), &h); err != nil {
				return "", fmt.Errorf("YAML parse error on %s: %v", name, err)
			}
			if h.Metadata != nil && h.Metadata.Annotations["helm.sh/hook"] != "" {
				return "", fmt.Errorf("%s: hooks are not supported", name)
			}
			docs = append(docs, doc{source: name, content: d, kind: h.Kind})
		}
	}
	rank := map[string]int{}
	for i, k := range installOrder {
		rank[k] = i
	}
	sort.SliceStable(docs, func(i, j int) bool {
		a, aok := rank[docs[i].kind]
		b, bok := rank[docs[j].kind]
		switch {
		case !aok && !bok:
			return docs[i].kind < docs[j].kind
		case !aok:
			return false
		case !bok:
			return true
		}
		return a < b
	})
	var b strings.Builder
	for _, d := range docs {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", d.source, d.content)
	}
	return strings.TrimSpace(b.String()) + "\n", nil
}
