package page

// pageStyle is the page's one style sheet. It is constant: no value is ever
// written into it.
const pageStyle markup = `<style>
*,*::before,*::after{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{font:16px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;background:#f6f7f9;color:#1b1f24;overflow-wrap:anywhere}
header{background:#1b1f24;color:#fff;padding:.6rem 1.2rem;display:flex;flex-wrap:wrap;gap:.4rem 1rem;justify-content:space-between;align-items:center}
header form{display:inline;margin:0}
header button{background:none;border:1px solid #888;color:#fff;border-radius:4px;padding:.1rem .6rem;cursor:pointer}
main{max-width:46rem;margin:1.5rem auto;padding:0 1rem}
.card{background:#fff;border:1px solid #d8dde3;border-radius:8px;padding:1.2rem 1.4rem;margin-bottom:1rem;min-width:0}
h1{font-size:1.35rem;margin:.2rem 0 .6rem}
h2{font-size:1.1rem;margin:1.2rem 0 .4rem}
dl{display:grid;grid-template-columns:minmax(0,max-content) minmax(0,1fr);gap:.3rem 1rem;margin:1rem 0}
dt{color:#57606a}
dd{margin:0;min-width:0}
code{overflow-wrap:anywhere;word-break:break-word}
pre{background:#f0f2f4;border-radius:6px;padding:.8rem;font-size:.9rem;white-space:pre-wrap;overflow-wrap:anywhere;word-break:break-word;max-width:100%}
.risk{font-weight:700}
.state{display:inline-block;border-radius:999px;padding:.05rem .7rem;font-size:.85rem;font-weight:600;background:#e7ecf2}
.state-APPROVED,.state-REDEEMED{background:#dafbe1;color:#116329}
.state-DECLINED,.state-EXPIRED{background:#ffebe9;color:#a40e26}
.withheld em{color:#a40e26;font-style:normal;font-weight:600}
ul.fields{list-style:none;padding:0;margin:.4rem 0}
ul.fields li{border-top:1px solid #eef0f2;padding:.6rem 0;min-width:0}
.f-label{font-weight:600;color:#1b1f24}
.f-value{margin:.15rem 0 0;font-size:1.05rem;white-space:pre-wrap;unicode-bidi:isolate}
.f-raw{color:#57606a;font-size:.9rem;white-space:normal}
.kind-money .f-value{font-weight:700;font-variant-numeric:tabular-nums}
.kind-withheld .f-value{color:#a40e26;font-weight:600}
.f-agent{margin:.3rem 0 0;padding:.5rem .7rem;border-left:4px solid #bf8700;background:#fff8c5;border-radius:0 6px 6px 0;white-space:pre-wrap;unicode-bidi:isolate;font-style:italic}
.f-agent::before{content:"“"}
.f-agent::after{content:"”"}
.tag{display:inline-block;font-size:.75rem;font-weight:600;border-radius:4px;padding:0 .4rem;margin-left:.3rem;vertical-align:middle;background:#fff1c2;color:#7d4e00;border:1px solid #d4a72c}
.f-desc{color:#57606a;font-size:.85rem;margin:.2rem 0 0}
.f-problem{color:#a40e26;font-size:.9rem;font-weight:600;margin:.2rem 0 0}
details{margin-top:.8rem}
summary{cursor:pointer;color:#57606a}
.actions{display:flex;flex-wrap:wrap;gap:1rem;margin-top:.8rem}
.actions form{margin:0}
.actions button{font-size:1.05rem;padding:.6rem 1.6rem;border-radius:6px;border:1px solid;cursor:pointer;min-width:8rem}
#approve{background:#1f883d;color:#fff;border-color:#1a7f37}
#decline{background:#fff;color:#a40e26;border-color:#a40e26}
.note{color:#57606a;font-size:.9rem}
.top{margin:0;display:flex;flex-wrap:wrap;gap:.3rem .8rem;align-items:center}
.expires{color:#57606a;font-size:.9rem}
#asks{margin:.2rem 0 .6rem}
#hint{margin:.2rem 0}
ul.amounts{list-style:none;padding:0;margin:.4rem 0}
ul.amounts li{display:flex;flex-wrap:wrap;gap:0 .6rem;align-items:baseline}
.a-label{color:#57606a}
.a-value{font-size:1.5rem;font-variant-numeric:tabular-nums;unicode-bidi:isolate}
.effects-head{margin:.6rem 0 .2rem;color:#57606a;font-size:.9rem}
ul.effects{margin:.2rem 0 .4rem;padding-left:1.2rem}
.next{color:#57606a;font-size:.9rem;margin:.8rem 0 0}
#details h2:first-child{margin-top:0}
ul.list{list-style:none;padding:0}
ul.list li{padding:.5rem 0;border-bottom:1px solid #eef0f2}
header nav{display:flex;flex-wrap:wrap;gap:.2rem .8rem}
header a{color:#fff}
.chain{border-radius:6px;padding:.5rem .8rem;font-weight:600;margin:.6rem 0}
.chain-ok{background:#dafbe1;color:#116329}
.chain-broken{background:#ffebe9;color:#a40e26}
.filters{display:flex;flex-wrap:wrap;gap:.5rem 1rem;align-items:flex-end;margin-top:.6rem}
.filters label{display:flex;flex-direction:column;font-size:.85rem;color:#57606a;min-width:0;flex:1 1 9rem}
.filters input,.filters select{font:inherit;font-size:.95rem;padding:.25rem .4rem;border:1px solid #d0d7de;border-radius:4px;min-width:0;width:100%;background:#fff}
.filters button,.pager button{font:inherit;padding:.3rem 1rem;border-radius:6px;border:1px solid #1b1f24;background:#1b1f24;color:#fff;cursor:pointer}
ol.rows{list-style:none;padding:0;margin:0}
ol.rows li{border-bottom:1px solid #eef0f2;padding:.6rem 0;min-width:0}
.r-top{display:flex;flex-wrap:wrap;gap:.2rem .6rem;align-items:baseline}
.seq{color:#57606a;font-variant-numeric:tabular-nums}
.outcome{display:inline-block;border-radius:999px;padding:0 .6rem;font-size:.8rem;font-weight:600;background:#e7ecf2}
.o-executed,.o-approved,.o-allowed{background:#dafbe1;color:#116329}
.o-refused,.o-failed,.o-declined{background:#ffebe9;color:#a40e26}
.o-unknown{background:#fff1c2;color:#7d4e00}
.r-time{color:#57606a;font-size:.85rem}
.r-who,.r-code,.r-msg,.r-approval,.r-decision{font-size:.9rem;margin-top:.15rem}
.r-msg{color:#57606a;white-space:pre-wrap}
.r-approval,.r-decision{background:#f0f6ff;border-radius:4px;padding:.2rem .5rem}
.r-id{font-size:.8rem;margin-top:.15rem}
.pager{display:flex;flex-wrap:wrap;gap:.6rem;margin-top:.8rem}
.pager form{margin:0}
bdi{unicode-bidi:isolate}
@media (max-width:30rem){
main{padding:0 .5rem;margin-top:.6rem}
h1{font-size:1.2rem}
.actions{gap:.6rem}
.actions form{flex:1}
.actions button{width:100%;min-width:0}
.card{padding:1rem .8rem}
dl{grid-template-columns:minmax(0,1fr);gap:0}
dd{margin-bottom:.4rem}
.filters label{flex:1 1 40%}
header{padding:.5rem .8rem}
}
</style>`
