// SPDX-License-Identifier: Apache-2.0

package metrics

// The shipped CloudWatch alarm and dashboard, checked against the
// CloudWatch API's own service model (botocore's service-2.json, Debian's
// python3-botocore, which tests/deps.sh installs): the shapes, required
// members, types, enums, lengths, ranges and patterns of PutMetricAlarm's
// and PutDashboard's input, plus the rules the model states only in its
// documentation (Metrics against the single-metric fields, one ReturnData,
// metric ids), and the basics of a DashboardBody.

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// botocoreCloudWatch are where the CloudWatch service model is found:
// Debian's python3-botocore, or a pip install of botocore.
var botocoreCloudWatch = []string{
	"/usr/lib/python3/dist-packages/botocore/data/cloudwatch/*/service-2.json",
	"/usr/local/lib/python3*/dist-packages/botocore/data/cloudwatch/*/service-2.json",
	"/usr/lib/python3*/site-packages/botocore/data/cloudwatch/*/service-2.json",
	"/usr/local/lib/python3*/site-packages/botocore/data/cloudwatch/*/service-2.json",
}

type awsShape struct {
	Type     string
	Required []string
	Members  map[string]struct{ Shape string }
	Member   *struct{ Shape string }
	Key      *struct{ Shape string }
	Value    *struct{ Shape string }
	Enum     []string
	Min, Max *float64
	Pattern  string
}

type awsModel struct {
	Metadata struct{ APIVersion string }
	Shapes   map[string]awsShape
}

// loadCloudWatchModel reads the newest CloudWatch API version's model.
func loadCloudWatchModel(t *testing.T) (*awsModel, string) {
	t.Helper()
	var found []string
	if p := os.Getenv("GPUFENCE_CLOUDWATCH_MODEL"); p != "" {
		found = []string{p}
	}
	for _, g := range botocoreCloudWatch {
		m, _ := filepath.Glob(g)
		sort.Strings(m)
		found = append(found, m...)
	}
	if len(found) == 0 {
		t.Skipf("no CloudWatch service model (botocore data/cloudwatch/*/service-2.json) in %v: install python3-botocore (tests/deps.sh does)", botocoreCloudWatch)
	}
	path := found[0]
	if os.Getenv("GPUFENCE_CLOUDWATCH_MODEL") == "" {
		path = found[len(found)-1] // API versions are dates: the last sorts newest
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m awsModel
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, s := range []string{"PutMetricAlarmInput", "PutDashboardInput", "MetricDataQuery"} {
		if _, ok := m.Shapes[s]; !ok {
			t.Fatalf("%s has no shape %s", path, s)
		}
	}
	return &m, path
}

// checkShape validates v (decoded JSON, numbers as json.Number) against
// the model's shape name and appends what is wrong, each naming its path.
func (m *awsModel) checkShape(v any, name, path string, errs *[]string) {
	bad := func(f string, a ...any) { *errs = append(*errs, path+": "+fmt.Sprintf(f, a...)) }
	s, ok := m.Shapes[name]
	if !ok {
		bad("the model has no shape %s", name)
		return
	}
	switch s.Type {
	case "structure":
		obj, ok := v.(map[string]any)
		if !ok {
			bad("want an object (%s), got %T", name, v)
			return
		}
		for _, r := range s.Required {
			if _, ok := obj[r]; !ok {
				bad("missing required member %s of %s", r, name)
			}
		}
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			mem, ok := s.Members[k]
			if !ok {
				bad("%s has no member %s", name, k)
				continue
			}
			m.checkShape(obj[k], mem.Shape, path+"."+k, errs)
		}
	case "list":
		l, ok := v.([]any)
		if !ok {
			bad("want a list (%s), got %T", name, v)
			return
		}
		m.checkRange(float64(len(l)), s, "length", bad)
		for i, e := range l {
			m.checkShape(e, s.Member.Shape, fmt.Sprintf("%s[%d]", path, i), errs)
		}
	case "map":
		obj, ok := v.(map[string]any)
		if !ok {
			bad("want a map (%s), got %T", name, v)
			return
		}
		m.checkRange(float64(len(obj)), s, "size", bad)
		for k, e := range obj {
			m.checkShape(k, s.Key.Shape, path+" key "+k, errs)
			m.checkShape(e, s.Value.Shape, path+"."+k, errs)
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			bad("want a string (%s), got %T", name, v)
			return
		}
		m.checkRange(float64(len([]rune(str))), s, "length", bad)
		if len(s.Enum) > 0 && !contains(s.Enum, str) {
			bad("%q is not one of %s's values %v", str, name, s.Enum)
		}
		if s.Pattern != "" {
			re, err := regexp.Compile("^(?:" + s.Pattern + ")$")
			if err != nil {
				bad("the model's pattern %q: %v", s.Pattern, err)
			} else if !re.MatchString(str) {
				bad("%q does not match %s's pattern %s", str, name, s.Pattern)
			}
		}
	case "integer", "long", "double", "float":
		n, ok := v.(json.Number)
		if !ok {
			bad("want a number (%s), got %T", name, v)
			return
		}
		f, err := n.Float64()
		if err != nil {
			bad("%s: %v", n, err)
			return
		}
		if (s.Type == "integer" || s.Type == "long") && f != math.Trunc(f) {
			bad("%s is not an integer (%s)", n, name)
		}
		if s.Type == "integer" && (f > math.MaxInt32 || f < math.MinInt32) {
			bad("%s does not fit %s's 32-bit integer", n, name)
		}
		m.checkRange(f, s, "value", bad)
	case "boolean":
		if _, ok := v.(bool); !ok {
			bad("want a boolean (%s), got %T", name, v)
		}
	case "timestamp", "blob":
		if _, ok := v.(string); !ok {
			bad("want a string (%s %s), got %T", s.Type, name, v)
		}
	default:
		bad("shape %s has type %q, which this check does not know", name, s.Type)
	}
}

func (m *awsModel) checkRange(n float64, s awsShape, what string, bad func(string, ...any)) {
	if s.Min != nil && n < *s.Min {
		bad("%s %v below the minimum %v", what, n, *s.Min)
	}
	if s.Max != nil && n > *s.Max {
		bad("%s %v above the maximum %v", what, n, *s.Max)
	}
}

func contains(l []string, s string) bool {
	for _, e := range l {
		if e == s {
			return true
		}
	}
	return false
}

var (
	// MetricDataQuery.Id: "The valid characters are letters, numbers, and
	// underscore. The first character must be a lowercase letter."
	metricIDRe = regexp.MustCompile(`^[a-z][A-Za-z0-9_]*$`)
	// Identifiers in a metric math expression; ids start in lower case,
	// functions and keywords (METRICS, FILL, REPEAT, PERIOD) are upper case.
	mathIdentRe = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)
	mathStrRe   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
)

// validPeriod: PutMetricAlarm's Period "Valid values are 10, 30, and any
// multiple of 60" (the model's documentation of Period).
func validPeriod(v any) bool {
	n, ok := v.(json.Number)
	if !ok {
		return false
	}
	p, err := n.Int64()
	return err == nil && (p == 10 || p == 30 || (p > 0 && p%60 == 0))
}

// checkPutMetricAlarm validates a PutMetricAlarm input (the JSON that
// `aws cloudwatch put-metric-alarm --cli-input-json` sends) and returns
// what the API would refuse.
func (m *awsModel) checkPutMetricAlarm(b []byte) []string {
	var errs []string
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	var in map[string]any
	if err := dec.Decode(&in); err != nil {
		return []string{"not a JSON object: " + err.Error()}
	}
	m.checkShape(in, "PutMetricAlarmInput", "PutMetricAlarm", &errs)
	bad := func(f string, a ...any) { errs = append(errs, "PutMetricAlarm: "+fmt.Sprintf(f, a...)) }
	has := func(k string) bool { _, ok := in[k]; return ok }

	single := []string{"MetricName", "Namespace", "Dimensions", "Period", "Unit", "Statistic", "ExtendedStatistic"}
	metrics, _ := in["Metrics"].([]any)
	switch {
	case has("Metrics"):
		// "If you use the Metrics parameter, you cannot include the
		// MetricName, Dimensions, Period, Namespace, Statistic, or
		// ExtendedStatistic parameters"; Unit qualifies MetricName's
		// statistic and goes with them.
		for _, k := range single {
			if has(k) {
				bad("%s is given with Metrics; with Metrics, %s belong in the Metrics array", k, strings.Join(single, ", "))
			}
		}
		m.checkAlarmQueries(metrics, in, bad)
	case has("MetricName"):
		if has("Statistic") == has("ExtendedStatistic") {
			bad("with MetricName, give either Statistic or ExtendedStatistic, not both or neither")
		}
		if !has("Namespace") {
			bad("MetricName without Namespace")
		}
		if !has("ThresholdMetricId") && !has("Period") {
			bad("Period is required for an alarm on a static threshold")
		}
		if has("Period") && !validPeriod(in["Period"]) {
			bad("Period %v: valid values are 10, 30 and multiples of 60", in["Period"])
		}
	default:
		bad("neither MetricName nor Metrics: the alarm watches nothing")
	}
	if has("ExtendedStatistic") {
		if s, _ := in["ExtendedStatistic"].(string); !regexp.MustCompile(`^p(100(\.0+)?|[0-9]{1,2}(\.[0-9]+)?)$`).MatchString(s) {
			bad("ExtendedStatistic %q is not a percentile p0.0–p100", s)
		}
	}
	if has("ThresholdMetricId") {
		if has("Threshold") {
			bad("Threshold with ThresholdMetricId (an anomaly detection alarm has no static threshold)")
		}
	} else if !has("Threshold") {
		bad("Threshold is required for an alarm on a static threshold")
	}
	if op, _ := in["ComparisonOperator"].(string); strings.Contains(op, "Lower") || strings.Contains(op, "Upper") {
		if !has("ThresholdMetricId") {
			bad("ComparisonOperator %s is for anomaly detection alarms (ThresholdMetricId)", op)
		}
	}
	if v, ok := in["TreatMissingData"].(string); ok && !contains([]string{"breaching", "notBreaching", "ignore", "missing"}, v) {
		bad("TreatMissingData %q: valid values are breaching, notBreaching, ignore, missing", v)
	}
	if v, ok := in["EvaluateLowSampleCountPercentile"].(string); ok && !contains([]string{"evaluate", "ignore"}, v) {
		bad("EvaluateLowSampleCountPercentile %q: valid values are evaluate, ignore", v)
	}
	if d, ok := in["DatapointsToAlarm"].(json.Number); ok {
		if e, ok := in["EvaluationPeriods"].(json.Number); ok {
			dn, _ := d.Int64()
			en, _ := e.Int64()
			if dn > en {
				bad("DatapointsToAlarm %d is more than EvaluationPeriods %d", dn, en)
			}
		}
	}
	for _, k := range []string{"AlarmActions", "OKActions", "InsufficientDataActions"} {
		l, _ := in[k].([]any)
		for _, a := range l {
			if s, _ := a.(string); !strings.HasPrefix(s, "arn:") {
				bad("%s: %q is not an ARN", k, s)
			}
		}
	}
	return errs
}

func (m *awsModel) checkAlarmQueries(metrics []any, in map[string]any, bad func(string, ...any)) {
	if len(metrics) == 0 {
		bad("Metrics is empty")
		return
	}
	ids := map[string]bool{}
	for _, q := range metrics {
		if o, ok := q.(map[string]any); ok {
			if id, ok := o["Id"].(string); ok {
				if ids[id] {
					bad("Metrics: Id %q is used twice", id)
				}
				ids[id] = true
			}
		}
	}
	returned := 0
	for i, q := range metrics {
		o, ok := q.(map[string]any)
		if !ok {
			continue // the shape check said so
		}
		id, _ := o["Id"].(string)
		if !metricIDRe.MatchString(id) {
			bad("Metrics[%d].Id %q: letters, digits and underscore, starting with a lower-case letter", i, id)
		}
		// "If you omit this, the default of true is used."
		if r, ok := o["ReturnData"].(bool); !ok || r {
			returned++
		}
		_, stat := o["MetricStat"]
		expr, isExpr := o["Expression"].(string)
		if stat == isExpr {
			bad("Metrics[%d] (%s): give either Expression or MetricStat, not both or neither", i, id)
		}
		if stat {
			ms, _ := o["MetricStat"].(map[string]any)
			if p, ok := ms["Period"]; ok && !validPeriod(p) {
				bad("Metrics[%d].MetricStat.Period %v: valid values are 10, 30 and multiples of 60", i, p)
			}
			if _, ok := o["Period"]; ok {
				bad("Metrics[%d]: Period goes in MetricStat for a metric, on the query only for an expression", i)
			}
		}
		if isExpr {
			p, ok := o["Period"]
			switch {
			case strings.HasPrefix(strings.ToUpper(strings.TrimSpace(expr)), "SELECT"):
				// A Metrics Insights query has no metric of its own to
				// take the period from.
				if !ok {
					bad("Metrics[%d] (%s): a Metrics Insights query in an alarm needs Period", i, id)
				}
			default:
				for _, ident := range mathIdentRe.FindAllString(mathStrRe.ReplaceAllString(expr, ""), -1) {
					if ident[0] >= 'a' && ident[0] <= 'z' {
						if ident == id {
							bad("Metrics[%d]: expression %q refers to itself", i, expr)
						} else if !ids[ident] {
							bad("Metrics[%d]: expression %q refers to %s, which no query in Metrics has as Id", i, expr, ident)
						}
					}
				}
			}
			if ok && !validPeriod(p) {
				bad("Metrics[%d].Period %v: valid values are 10, 30 and multiples of 60", i, p)
			}
		}
	}
	if returned != 1 {
		bad("Metrics: %d queries have ReturnData true (or omitted, which means true); an alarm needs exactly one", returned)
	}
	if tid, ok := in["ThresholdMetricId"].(string); ok && !ids[tid] {
		bad("ThresholdMetricId %q is no Id in Metrics", tid)
	}
}

// The placeholders the shipped templates have, filled in as the guide does
// (docs/parallelcluster.md, "CloudWatch").
var cloudwatchPlaceholders = strings.NewReplacer(
	"__CLUSTER_NAME__", "mycluster",
	"__SNS_TOPIC_ARN__", "arn:aws:sns:us-east-1:123456789012:gpu-idle",
	"__REGION__", "us-east-1",
)

// shippedAlarms are every alarm template the package ships.
func shippedAlarms(t *testing.T) []string {
	t.Helper()
	l, err := filepath.Glob(cloudwatchDir + "*alarm*.json")
	if err != nil || len(l) == 0 {
		t.Fatalf("no alarm templates in %s (%v)", cloudwatchDir, err)
	}
	return l
}

func TestCloudWatchAlarmsPutMetricAlarm(t *testing.T) {
	m, path := loadCloudWatchModel(t)
	t.Logf("CloudWatch API %s from %s", m.Metadata.APIVersion, path)
	for _, f := range shippedAlarms(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		filled := cloudwatchPlaceholders.Replace(string(b))
		if strings.Contains(filled, "__") {
			t.Errorf("%s: a placeholder the guide does not fill: %s", f, regexp.MustCompile(`__[A-Z_]+__`).FindString(filled))
		}
		for _, e := range m.checkPutMetricAlarm([]byte(filled)) {
			t.Errorf("%s: %s", filepath.Base(f), e)
		}
	}
}

// TestCloudWatchAlarmCheckFails: the check refuses what the API refuses,
// among them the alarm this package used to ship (testdata), which had
// Namespace next to Metrics.
func TestCloudWatchAlarmCheckFails(t *testing.T) {
	m, _ := loadCloudWatchModel(t)
	old, err := os.ReadFile("testdata/idle-gpu-alarm-namespace-with-metrics.json")
	if err != nil {
		t.Fatal(err)
	}
	good := `{"AlarmName":"a","EvaluationPeriods":1,"ComparisonOperator":"GreaterThanThreshold","Threshold":1,
		"Metrics":[{"Id":"m1","MetricStat":{"Metric":{"Namespace":"gpufence","MetricName":"x"},"Period":60,"Stat":"Maximum"},"ReturnData":false},
		{"Id":"e1","Expression":"m1 * 2","ReturnData":true}]}`
	if errs := m.checkPutMetricAlarm([]byte(good)); len(errs) != 0 {
		t.Fatalf("a valid alarm refused: %v", errs)
	}
	cases := []struct{ name, alarm, want string }{
		{"old shipped alarm", cloudwatchPlaceholders.Replace(string(old)), "Namespace is given with Metrics"},
		{"Statistic with Metrics", strings.Replace(good, `"Threshold":1,`, `"Threshold":1,"Statistic":"Maximum",`, 1), "Statistic is given with Metrics"},
		{"Unit with Metrics", strings.Replace(good, `"Threshold":1,`, `"Threshold":1,"Unit":"Seconds",`, 1), "Unit is given with Metrics"},
		{"two ReturnData", strings.Replace(good, `"ReturnData":false`, `"ReturnData":true`, 1), "2 queries have ReturnData true"},
		{"ReturnData omitted", strings.Replace(good, `,"ReturnData":false`, ``, 1), "2 queries have ReturnData true"},
		{"unknown id", strings.Replace(good, `m1 * 2`, `m2 * 2`, 1), "refers to m2"},
		{"bad id", strings.Replace(strings.Replace(good, `"m1"`, `"M1"`, 1), `m1 * 2`, `M1 * 2`, 1), `Id "M1"`},
		{"duplicate id", strings.Replace(good, `"e1"`, `"m1"`, 1), `used twice`},
		{"both stat and expression", strings.Replace(good, `"Id":"e1",`, `"Id":"e1","MetricStat":{"Metric":{"MetricName":"y"},"Period":60,"Stat":"Sum"},`, 1), "either Expression or MetricStat"},
		{"unknown member", strings.Replace(good, `"AlarmName":"a",`, `"AlarmName":"a","Severity":"high",`, 1), "has no member Severity"},
		{"required missing", strings.Replace(good, `"EvaluationPeriods":1,`, ``, 1), "missing required member EvaluationPeriods"},
		{"enum", strings.Replace(good, `GreaterThanThreshold`, `Greater`, 1), `"Greater" is not one of`},
		{"type", strings.Replace(good, `"EvaluationPeriods":1`, `"EvaluationPeriods":"1"`, 1), "want a number"},
		{"minimum", strings.Replace(good, `"EvaluationPeriods":1`, `"EvaluationPeriods":0`, 1), "below the minimum 1"},
		{"length", strings.Replace(good, `"AlarmName":"a"`, `"AlarmName":""`, 1), "length 0 below the minimum 1"},
		{"pattern", strings.Replace(good, `"Namespace":"gpufence"`, `"Namespace":":gpufence"`, 1), "does not match Namespace's pattern"},
		{"period", strings.Replace(good, `"Period":60`, `"Period":45`, 1), "Period 45"},
		{"no threshold", strings.Replace(good, `"Threshold":1,`, ``, 1), "Threshold is required"},
		{"treat missing", strings.Replace(good, `"Threshold":1,`, `"Threshold":1,"TreatMissingData":"zero",`, 1), `TreatMissingData "zero"`},
		{"single metric without statistic", `{"AlarmName":"a","EvaluationPeriods":1,"ComparisonOperator":"GreaterThanThreshold","Threshold":1,"Namespace":"gpufence","MetricName":"x","Period":60}`, "either Statistic or ExtendedStatistic"},
		{"insights query without period", `{"AlarmName":"a","EvaluationPeriods":1,"ComparisonOperator":"GreaterThanThreshold","Threshold":1,"Metrics":[{"Id":"q","Expression":"SELECT MAX(x) FROM gpufence"}]}`, "needs Period"},
	}
	for _, c := range cases {
		errs := m.checkPutMetricAlarm([]byte(c.alarm))
		if !strings.Contains(strings.Join(errs, "\n"), c.want) {
			t.Errorf("%s: want an error containing %q, got %q", c.name, c.want, errs)
		}
	}
}

// emfDeclarations returns, for each metric the CloudWatch agent's EMF
// declarations select, the dimension sets it is published with.
func emfDeclarations(t *testing.T) map[string][][]string {
	t.Helper()
	cw := readAgentConfig(t)
	out := map[string][][]string{}
	for _, d := range cw.Logs.MetricsCollected.Prometheus.EMF.Declarations {
		for _, sel := range d.Selectors {
			name := strings.TrimSuffix(strings.TrimPrefix(sel, "^"), "$")
			out[name] = append(out[name], d.Dimensions...)
		}
	}
	return out
}

// unboundedLabels grow with the jobs a cluster runs: as CloudWatch
// dimensions each value would be a new custom metric, billed.
var unboundedLabels = []string{"job_id", "user", "uid", "uuid", "step_id"}

func TestCloudWatchDimensionsBounded(t *testing.T) {
	decl := emfDeclarations(t)
	if len(decl) == 0 {
		t.Fatal("no EMF declarations")
	}
	for name, sets := range decl {
		for _, set := range sets {
			for _, d := range set {
				if contains(unboundedLabels, d) {
					t.Errorf("%s is published with dimension %s (one custom metric per value); per-job detail belongs in the logs", name, d)
				}
			}
		}
	}
}

var (
	insightsRe = regexp.MustCompile(`^SELECT\s+(\w+)\((\w+)\)\s+FROM\s+SCHEMA\(([^)]*)\)(.*)$`)
	// WHERE/GROUP BY name dimensions as bare words before = or in the list.
	insightsDimRe = regexp.MustCompile(`(?:WHERE|AND|OR)\s+"?(\w+)"?\s*(?:=|!=)\s*'([^']*)'|GROUP BY\s+([\w\s,"]+?)(?:\s+ORDER BY|\s+LIMIT|$)`)
)

// checkInsightsQuery checks a Metrics Insights query of the shipped files
// against what the CloudWatch agent publishes: the namespace, a metric it
// publishes, with exactly one of its dimension sets as the SCHEMA (a
// CloudWatch metric is its name and its exact set of dimensions), and
// filters and groups only on those dimensions.
func checkInsightsQuery(q string, decl map[string][][]string, values map[string]map[string]bool) error {
	m := insightsRe.FindStringSubmatch(strings.TrimSpace(q))
	if m == nil {
		return fmt.Errorf("not SELECT FUNC(metric) FROM SCHEMA(namespace, dimensions...): %q", q)
	}
	if !contains([]string{"AVG", "COUNT", "MAX", "MIN", "SUM"}, m[1]) {
		return fmt.Errorf("%q: Metrics Insights has no function %s", q, m[1])
	}
	var schema []string
	for _, f := range strings.Split(m[3], ",") {
		schema = append(schema, strings.Trim(strings.TrimSpace(f), `"`))
	}
	if schema[0] != "gpufence" {
		return fmt.Errorf("%q: namespace %s, the agent publishes into gpufence", q, schema[0])
	}
	sets, ok := decl[m[2]]
	if !ok {
		return fmt.Errorf("%q: the CloudWatch agent publishes no %s", q, m[2])
	}
	dims := append([]string(nil), schema[1:]...)
	sort.Strings(dims)
	found := false
	for _, s := range sets {
		s = append([]string(nil), s...)
		sort.Strings(s)
		found = found || strings.Join(s, ",") == strings.Join(dims, ",")
	}
	if !found {
		return fmt.Errorf("%q: %s is published with the dimensions %v, not %v", q, m[2], sets, dims)
	}
	for _, c := range insightsDimRe.FindAllStringSubmatch(m[4], -1) {
		var used []string
		if c[1] != "" {
			used = []string{c[1]}
			if vals, ok := values[m[2]+"/"+c[1]]; ok && !vals[c[2]] {
				return fmt.Errorf("%q: %s never has %s %q", q, m[2], c[1], c[2])
			}
		} else {
			for _, g := range strings.Split(c[3], ",") {
				used = append(used, strings.Trim(strings.TrimSpace(g), `"`))
			}
		}
		for _, u := range used {
			if !contains(schema[1:], u) {
				return fmt.Errorf("%q: %s is not a dimension of its SCHEMA", q, u)
			}
		}
	}
	return nil
}

// labelValues: the values each label of each metric takes in the test
// registry, where a label's values are a fixed set (decision).
func labelValues(t *testing.T) map[string]map[string]bool {
	t.Helper()
	fams, err := populated(t).Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, p := range m.GetLabel() {
				if p.GetName() != "decision" {
					continue
				}
				k := f.GetName() + "/" + p.GetName()
				if out[k] == nil {
					out[k] = map[string]bool{}
				}
				out[k][p.GetValue()] = true
			}
		}
	}
	return out
}

func TestCloudWatchAlarmsQueryPublishedMetrics(t *testing.T) {
	decl, values := emfDeclarations(t), labelValues(t)
	for _, f := range shippedAlarms(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var a struct {
			Metrics []struct{ Expression string }
		}
		if err := json.Unmarshal([]byte(cloudwatchPlaceholders.Replace(string(b))), &a); err != nil {
			t.Fatal(err)
		}
		for _, q := range a.Metrics {
			if strings.HasPrefix(q.Expression, "SELECT") {
				if err := checkInsightsQuery(q.Expression, decl, values); err != nil {
					t.Errorf("%s: %v", filepath.Base(f), err)
				}
			}
		}
	}
}

// TestCloudWatchDashboard checks the shipped dashboard as PutDashboard's
// DashboardBody ("Dashboard Body Structure and Syntax" in the CloudWatch
// API reference): the input shape from the service model, a JSON object
// with widgets of the known types, each within the 24-column grid, with
// the properties its type requires; its metric queries ask for what the
// CloudWatch agent publishes, its log queries read the log groups it
// writes.
func TestCloudWatchDashboard(t *testing.T) {
	m, _ := loadCloudWatchModel(t)
	b, err := os.ReadFile(cloudwatchDir + "gpufence-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	body := cloudwatchPlaceholders.Replace(string(b))
	if strings.Contains(body, "__") {
		t.Errorf("a placeholder the guide does not fill: %s", regexp.MustCompile(`__[A-Z_]+__`).FindString(body))
	}
	var errs []string
	m.checkShape(map[string]any{"DashboardName": "gpufence-mycluster", "DashboardBody": body}, "PutDashboardInput", "PutDashboard", &errs)
	for _, e := range errs {
		t.Error(e)
	}
	for _, e := range checkDashboardBody(t, []byte(body)) {
		t.Error(e)
	}
	// The checks refuse what they should.
	for _, c := range []struct{ body, want string }{
		{`[]`, "not a JSON object"},
		{`{"widgets":[]}`, "no widgets"},
		{`{"widgets":[{"type":"graph","properties":{}}]}`, `type "graph"`},
		{`{"widgets":[{"type":"text","width":25,"properties":{"markdown":"x"}}]}`, "width 25"},
		{`{"widgets":[{"type":"text","properties":{}}]}`, "markdown"},
		{`{"widgets":[{"type":"metric","properties":{"region":"us-east-1","metrics":[[{"expression":"SELECT MAX(gpufence_gpu_idle_seconds) FROM SCHEMA(gpufence, ClusterName, instance_id, job_id, gpu)"}]]}}]}`, "not [ClusterName gpu instance_id job_id]"},
		{`{"widgets":[{"type":"metric","properties":{"region":"us-east-1","metrics":[["gpufence","gpufence_gpu_idle_seconds","job_id","1"]]}}]}`, "dimensions"},
		{`{"widgets":[{"type":"metric","properties":{"metrics":[]}}]}`, "region"},
		{`{"widgets":[{"type":"log","properties":{"region":"us-east-1","query":"SOURCE '/other' | fields @message"}}]}`, "/other"},
		{`{"widgets":[{"type":"metric","properties":{"region":"us-east-1","metrics":[[{"expression":"SELECT SUM(gpufence_gpu_access_total) FROM SCHEMA(gpufence, ClusterName, instance_id, decision) WHERE decision = 'deny'"}]]}}]}`, `decision "deny"`},
	} {
		if got := strings.Join(checkDashboardBody(t, []byte(c.body)), "\n"); !strings.Contains(got, c.want) {
			t.Errorf("dashboard %s: want an error containing %q, got %q", c.body, c.want, got)
		}
	}
}

func checkDashboardBody(t *testing.T, b []byte) []string {
	decl, values := emfDeclarations(t), labelValues(t)
	var errs []string
	bad := func(f string, a ...any) { errs = append(errs, "DashboardBody: "+fmt.Sprintf(f, a...)) }
	var body map[string]any
	if err := json.Unmarshal(b, &body); err != nil {
		return []string{"DashboardBody: not a JSON object: " + err.Error()}
	}
	for k := range body {
		if !contains([]string{"widgets", "start", "end", "periodOverride", "variables"}, k) {
			bad("unknown top-level member %s", k)
		}
	}
	if p, ok := body["periodOverride"].(string); ok && p != "auto" && p != "inherit" {
		bad("periodOverride %q: auto or inherit", p)
	}
	widgets, _ := body["widgets"].([]any)
	if len(widgets) == 0 {
		bad("no widgets")
	}
	groups := map[string]bool{"/gpufence/audit": true, "/gpufence/metrics": true}
	for i, w := range widgets {
		o, ok := w.(map[string]any)
		if !ok {
			bad("widgets[%d] is not an object", i)
			continue
		}
		typ, _ := o["type"].(string)
		if !contains([]string{"metric", "text", "log", "alarm", "explorer", "custom"}, typ) {
			bad("widgets[%d]: type %q is none of metric, text, log, alarm, explorer, custom", i, typ)
		}
		for k, lim := range map[string][2]float64{"x": {0, 23}, "y": {0, math.MaxInt32}, "width": {1, 24}, "height": {1, 1000}} {
			if v, ok := o[k]; ok {
				n, ok := v.(float64)
				if !ok || n != math.Trunc(n) || n < lim[0] || n > lim[1] {
					bad("widgets[%d]: %s %v is not an integer in [%v, %v]", i, k, v, lim[0], lim[1])
				}
			}
		}
		if x, ok := o["x"].(float64); ok {
			wd, ok := o["width"].(float64)
			if !ok {
				wd = 6
			}
			if x+wd > 24 {
				bad("widgets[%d]: x %v + width %v goes past the 24 columns", i, x, wd)
			}
		}
		p, ok := o["properties"].(map[string]any)
		if !ok {
			bad("widgets[%d]: no properties", i)
			continue
		}
		switch typ {
		case "text":
			if s, _ := p["markdown"].(string); s == "" {
				bad("widgets[%d]: a text widget needs markdown", i)
			}
		case "log":
			q, _ := p["query"].(string)
			if _, ok := p["region"].(string); !ok {
				bad("widgets[%d]: a log widget needs region", i)
			}
			src := regexp.MustCompile(`^SOURCE\s+'([^']+)'`).FindStringSubmatch(q)
			if src == nil {
				bad("widgets[%d]: log query %q does not start with SOURCE 'log group'", i, q)
			} else if !groups[src[1]] {
				bad("widgets[%d]: log group %s is none the CloudWatch agent configuration writes", i, src[1])
			}
		case "metric":
			if _, ok := p["region"].(string); !ok {
				bad("widgets[%d]: a metric widget needs region", i)
			}
			if v, ok := p["view"].(string); ok && !contains([]string{"timeSeries", "singleValue", "gauge", "bar", "pie", "table"}, v) {
				bad("widgets[%d]: view %q", i, v)
			}
			if v, ok := p["period"].(float64); ok && !(v == 1 || v == 5 || v == 10 || v == 30 || (v > 0 && math.Mod(v, 60) == 0)) {
				bad("widgets[%d]: period %v: 1, 5, 10, 30 or a multiple of 60", i, v)
			}
			ms, ok := p["metrics"].([]any)
			if !ok {
				bad("widgets[%d]: a metric widget needs metrics", i)
			}
			for j, e := range ms {
				row, _ := e.([]any)
				if len(row) == 0 {
					bad("widgets[%d].metrics[%d] is not a non-empty array", i, j)
					continue
				}
				if opt, ok := row[0].(map[string]any); ok {
					expr, _ := opt["expression"].(string)
					if expr == "" {
						bad("widgets[%d].metrics[%d]: an options-only row needs an expression", i, j)
					} else if err := checkInsightsQuery(expr, decl, values); err != nil {
						bad("widgets[%d].metrics[%d]: %v", i, j, err)
					}
					if id, ok := opt["id"].(string); ok && !metricIDRe.MatchString(id) {
						bad("widgets[%d].metrics[%d]: id %q", i, j, id)
					}
					continue
				}
				// [namespace, metric, dim1, value1, ..., {options}]
				var strs []string
				for _, s := range row {
					if str, ok := s.(string); ok {
						strs = append(strs, str)
					}
				}
				if len(strs) < 2 || len(strs)%2 != 0 {
					bad("widgets[%d].metrics[%d]: want namespace, metric name and dimension name/value pairs", i, j)
					continue
				}
				var dims []string
				for k := 2; k < len(strs); k += 2 {
					dims = append(dims, strs[k])
				}
				sort.Strings(dims)
				ok := false
				for _, s := range decl[strs[1]] {
					s = append([]string(nil), s...)
					sort.Strings(s)
					ok = ok || strings.Join(s, ",") == strings.Join(dims, ",")
				}
				if strs[0] != "gpufence" || !ok {
					bad("widgets[%d].metrics[%d]: %s %s with dimensions %v is not what the agent publishes (%v)", i, j, strs[0], strs[1], dims, decl[strs[1]])
				}
			}
		}
	}
	return errs
}
