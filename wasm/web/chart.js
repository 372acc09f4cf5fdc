// A small line chart on a canvas: training loss per step (left axis) and test accuracy
// (right axis, 0 to 1), redrawn whenever a point arrives. No dependencies.
"use strict";

class LossChart {
  constructor(canvas) {
    this.canvas = canvas;
    this.loss = [];      // [step, loss]
    this.accuracy = [];  // [step, accuracy]
    this.draw();
  }
  addLoss(step, loss) { this.loss.push([step, loss]); this.draw(); }
  addAccuracy(step, accuracy) { this.accuracy.push([step, accuracy]); this.draw(); }
  reset() { this.loss = []; this.accuracy = []; this.draw(); }

  draw() {
    const c = this.canvas.getContext("2d");
    const w = this.canvas.width, h = this.canvas.height, pad = 44;
    c.clearRect(0, 0, w, h);
    c.fillStyle = "#fff";
    c.fillRect(0, 0, w, h);
    const steps = Math.max(1, ...this.loss.map((p) => p[0]), ...this.accuracy.map((p) => p[0]));
    const top = Math.max(0.1, ...this.loss.map((p) => p[1])) * 1.05;
    const x = (s) => pad + (w - 2 * pad) * s / steps;
    const yl = (v) => h - pad - (h - 2 * pad) * v / top;
    const ya = (v) => h - pad - (h - 2 * pad) * v;
    c.strokeStyle = "#999";
    c.beginPath();
    c.moveTo(pad, pad / 2); c.lineTo(pad, h - pad); c.lineTo(w - pad, h - pad); c.lineTo(w - pad, pad / 2);
    c.stroke();
    c.fillStyle = "#444";
    c.font = "12px system-ui, sans-serif";
    c.fillText("loss", 4, pad / 2 + 8);
    c.fillText(top.toFixed(2), 4, yl(top) + 12);
    c.fillText("0", pad - 14, h - pad);
    c.fillText("accuracy", w - pad - 20, pad / 2 - 6 + 8);
    c.fillText("1", w - pad + 6, ya(1) + 12);
    c.fillText(`step ${steps}`, w - pad - 40, h - pad + 18);
    if (this.loss.length) {
      c.strokeStyle = "#1f6feb";
      c.lineWidth = 2;
      c.beginPath();
      this.loss.forEach(([s, v], i) => (i ? c.lineTo(x(s), yl(v)) : c.moveTo(x(s), yl(v))));
      c.stroke();
      c.lineWidth = 1;
    }
    c.fillStyle = "#d9480f";
    for (const [s, v] of this.accuracy) {
      c.beginPath();
      c.arc(x(s), ya(v), 5, 0, 2 * Math.PI);
      c.fill();
      c.fillText(`${(100 * v).toFixed(1)}%`, x(s) - 48, ya(v) - 8);
    }
  }
}
