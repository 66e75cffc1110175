// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

const dashboardFile = "../../packaging/grafana/gpufence-dashboard.json"

type dashboard struct {
	Templating struct {
		List []struct {
			Name, Type string
			Query      any
		}
	}
	Panels []dashPanel
}

type dashPanel struct {
	ID         int
	Type       string
	Title      string
	Datasource *struct{ Type, UID string }
	Targets    []struct{ Expr string }
	Panels     []dashPanel
}

var metricName = regexp.MustCompile(`\bgpufence_[a-z0-9_]+`)

// TestDashboard keeps packaging/grafana/gpufence-dashboard.json from
// rotting: it must be valid JSON whose queries use only metrics this
// package registers, through the Prometheus data source variable.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	dsVar := false
	var queries []string
	for _, v := range d.Templating.List {
		if v.Type == "datasource" && v.Name == "datasource" && v.Query == "prometheus" {
			dsVar = true
		}
		if q, ok := v.Query.(map[string]any); ok {
			s, _ := q["query"].(string)
			queries = append(queries, s)
		}
	}
	if !dsVar {
		t.Error("no Prometheus data source variable named datasource")
	}

	// What the agent exposes, with every family populated; a histogram
	// is queried through its _bucket, _sum and _count series.
	fams, err := populated(t).Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, f := range fams {
		known[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				known[f.GetName()+s] = true
			}
		}
	}

	ids := map[int]bool{}
	used := map[string]bool{}
	var walk func(ps []dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d twice", p.ID)
			}
			ids[p.ID] = true
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q does not use the ${datasource} variable", p.Title)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, q := range p.Targets {
				if !strings.Contains(q.Expr, "gpufence_") {
					t.Errorf("panel %q: query %q uses no gpufence metric", p.Title, q.Expr)
				}
				queries = append(queries, q.Expr)
			}
		}
	}
	walk(d.Panels)
	for _, q := range queries {
		for _, name := range metricName.FindAllString(q, -1) {
			used[name] = true
			if !known[name] {
				t.Errorf("query %q uses %s, which the agent does not export", q, name)
			}
		}
	}
	// The panels the dashboard exists for.
	for _, name := range []string{nameAccess, nameReqDuration + "_bucket", nameAuditLost, namePolicies, nameJobs,
		nameUtilization, nameIdle, nameAllocated, nameBuildInfo} {
		if !used[name] {
			t.Errorf("the dashboard shows no %s", name)
		}
	}
}
