// Package promqleval parses and evaluates PromQL with Prometheus's own parser
// and engine (github.com/prometheus/prometheus/promql), for the test of the
// shipped alerts and dashboard (tests/controller/test_alerts_and_dashboard.py).
//
// It is a Go test because Prometheus's in-memory test storage takes a
// testing.TB. The Python test builds it once (`go test -c`) and runs the
// binary with PROMQLEVAL_IN naming a JSON file:
//
//	{"load": "<a promqltest load block>", "at": "<duration>", "exprs": ["<expr>", ...]}
//
// and PROMQLEVAL_OUT naming where to write one result per expression, in order:
//
//	[{"expr": "...", "error": "", "metrics": ["<metric names it selects>"], "result": [{"labels": {...}, "value": 1}]}]
//
// A parse or evaluation error is reported in "error", not as a failed test,
// so the caller sees every expression's fate.
package promqleval

import (
	"context"
	"encoding/json"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
)

type input struct {
	Load  string   `json:"load"`
	At    string   `json:"at"`
	Exprs []string `json:"exprs"`
}

type sample struct {
	Labels map[string]string `json:"labels"`
	Value  float64           `json:"value"`
}

type output struct {
	Expr    string   `json:"expr"`
	Error   string   `json:"error"`
	Metrics []string `json:"metrics"`
	Result  []sample `json:"result"`
}

func TestEvaluate(t *testing.T) {
	raw, err := os.ReadFile(os.Getenv("PROMQLEVAL_IN"))
	if err != nil {
		t.Fatal(err)
	}
	var in input
	if err := json.Unmarshal(raw, &in); err != nil {
		t.Fatal(err)
	}
	at, err := model.ParseDuration(in.At)
	if err != nil {
		t.Fatal(err)
	}
	storage := promqltest.LoadedStorage(t, in.Load)
	engine := promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery)
	ts := time.Unix(0, 0).UTC().Add(time.Duration(at))
	outs := make([]output, 0, len(in.Exprs))
	for _, text := range in.Exprs {
		out := output{Expr: text, Metrics: []string{}, Result: []sample{}}
		expr, err := parser.NewParser(parser.Options{}).ParseExpr(text)
		if err != nil {
			out.Error = "parse: " + err.Error()
			outs = append(outs, out)
			continue
		}
		names := map[string]bool{}
		parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
			if vs, ok := node.(*parser.VectorSelector); ok && vs.Name != "" {
				names[vs.Name] = true
			}
			return nil
		})
		for name := range names {
			out.Metrics = append(out.Metrics, name)
		}
		sort.Strings(out.Metrics)
		query, err := engine.NewInstantQuery(context.Background(), storage, nil, text, ts)
		if err != nil {
			out.Error = "query: " + err.Error()
			outs = append(outs, out)
			continue
		}
		res := query.Exec(context.Background())
		if res.Err != nil {
			out.Error = "eval: " + res.Err.Error()
		} else if vector, ok := res.Value.(promql.Vector); ok {
			for _, s := range vector {
				out.Result = append(out.Result, sample{Labels: s.Metric.Map(), Value: s.F})
			}
		} else if scalar, ok := res.Value.(promql.Scalar); ok {
			out.Result = append(out.Result, sample{Labels: map[string]string{}, Value: scalar.V})
		}
		query.Close()
		outs = append(outs, out)
	}
	data, err := json.Marshal(outs)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(os.Getenv("PROMQLEVAL_OUT"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}
